"""Helpers shared by train_lm.py and train_cnn.py: data-parallel placement, the step
timer, checkpoints, and the --compare report (a PNG and a JSON).

Nothing here is specific to jaxgemm; the examples' models are where the kernels are used.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

# ---------------------------------------------------------------------------------------
# Data parallelism: one 1-D mesh over every visible device; batches are split along it,
# parameters and optimizer state are replicated. jit then runs each device's shard of the
# batch through the same program (jaxgemm's ops partition like jnp's: local GEMMs and
# convolutions, one all-reduce of each weight gradient).


def data_mesh():
    """A 1-D mesh named "data" over all visible devices."""
    return jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))


def shard_batch(mesh, *arrays):
    """Put each host array on the mesh, split along its first (batch) dimension."""
    sharding = NamedSharding(mesh, P("data"))
    out = tuple(jax.device_put(a, sharding) for a in arrays)
    return out if len(out) > 1 else out[0]


def replicate(mesh, *modules):
    """Copy the modules' (and optimizers') state to every device of the mesh, in place."""
    for module in modules:
        state = jax.device_put(nnx.state(module), NamedSharding(mesh, P()))
        nnx.update(module, state)


def check_divisible(batch_size, mesh):
    n = mesh.devices.size
    if batch_size % n:
        raise SystemExit(f"--batch-size {batch_size} must be a multiple of the {n} devices")


def param_count(model):
    return sum(x.size for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))


# ---------------------------------------------------------------------------------------
# Timing. JAX dispatches asynchronously, so a step's time is only known once its result
# is: the loops wait for the loss every few steps and divide the window's wall time by its
# steps. The first step (tracing and compiling) and windows holding an evaluation or a
# checkpoint are left out by calling `restart()` after them.


class StepTimer:
    def __init__(self):
        self.step_seconds = []  # one entry per timed window: seconds per step
        self._t0 = None
        self._step0 = 0

    def restart(self, step):
        self._t0, self._step0 = time.perf_counter(), step

    def lap(self, step):
        """Record the window that ends at `step` (after its result is ready); seconds/step."""
        now = time.perf_counter()
        per_step = None
        if self._t0 is not None and step > self._step0:
            per_step = (now - self._t0) / (step - self._step0)
            self.step_seconds.append(per_step)
        self._t0, self._step0 = now, step
        return per_step

    def median(self):
        return statistics.median(self.step_seconds) if self.step_seconds else float("nan")


# ---------------------------------------------------------------------------------------
# Checkpoints: the model and optimizer state (a pytree of arrays) plus a JSON dict of
# metadata (the step, the loss history). Orbax when it is installed (it comes with flax),
# otherwise one .npz per step beside a .json.


class Checkpointer:
    def __init__(self, directory, fresh):
        """fresh: remove checkpoints already in `directory` (a run that does not resume)."""
        self.directory = os.path.abspath(directory)
        if fresh and os.path.isdir(self.directory):
            shutil.rmtree(self.directory)
        os.makedirs(self.directory, exist_ok=True)
        try:
            import orbax.checkpoint as ocp
        except ImportError:
            self._ocp = self._manager = None
        else:
            self._ocp = ocp
            self._manager = ocp.CheckpointManager(
                self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=2),
                item_names=("state", "meta"))

    @property
    def kind(self):
        return "orbax" if self._manager else "npz"

    def latest_step(self):
        if self._manager:
            return self._manager.latest_step()
        return max(self._npz_steps(), default=None)

    def save(self, step, modules, meta):
        """Saves nnx.state(modules) (e.g. (model, optimizer)) and the JSON-able `meta`."""
        state = nnx.to_pure_dict(nnx.state(modules))
        if self._manager:
            args = self._ocp.args
            self._manager.save(step, args=args.Composite(state=args.StandardSave(state), meta=args.JsonSave(meta)))
            return
        leaves = jax.tree_util.tree_leaves(state)
        path = os.path.join(self.directory, f"step_{step}")
        np.savez(path + ".npz", *[np.asarray(x) for x in leaves])
        with open(path + ".json", "w") as f:
            json.dump(meta, f)
        for old in sorted(self._npz_steps())[:-2]:  # keep the last two, as orbax does
            for ext in (".npz", ".json"):
                os.remove(os.path.join(self.directory, f"step_{old}{ext}"))

    def _npz_steps(self):
        return [int(f[5:-4]) for f in os.listdir(self.directory) if f.startswith("step_") and f.endswith(".npz")]

    def restore(self, step, modules):
        """Loads checkpoint `step` into `modules` in place (their arrays' shardings kept);
        returns the metadata."""
        state = nnx.state(modules)
        target = nnx.to_pure_dict(state)
        if self._manager:
            args = self._ocp.args
            abstract = jax.tree_util.tree_map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), target)
            got = self._manager.restore(
                step, args=args.Composite(state=args.StandardRestore(abstract), meta=args.JsonRestore()))
            loaded, meta = got["state"], got["meta"]
        else:
            path = os.path.join(self.directory, f"step_{step}")
            with np.load(path + ".npz") as f:
                arrays = [f[f"arr_{i}"] for i in range(len(f.files))]
            leaves, treedef = jax.tree_util.tree_flatten(target)
            arrays = [jax.device_put(a, x.sharding) for a, x in zip(arrays, leaves)]
            loaded = jax.tree_util.tree_unflatten(treedef, arrays)
            with open(path + ".json") as f:
                meta = json.load(f)
        nnx.replace_by_pure_dict(state, loaded)
        nnx.update(modules, state)
        return meta

    def wait(self):
        if self._manager:
            self._manager.wait_until_finished()


# ---------------------------------------------------------------------------------------
# The --compare report.


def device_summary():
    d = jax.devices()[0]
    return f"{jax.device_count()} x {getattr(d, 'device_kind', d.platform)} ({jax.default_backend()})"


def write_compare(out_dir, name, runs, config, throughput_unit, throughput_per_step, log_y=False):
    """runs: {backend: {"curve": [[step, loss], ...], "eval": [[step, loss], ...],
    "eval_name": str, "summary": str, "step_ms": float, ...}}. Writes out_dir/name.json and
    name.png (the train loss of both backends on one axis, their held-out losses dashed; the
    median step time and throughput side by side); returns the two paths."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    report = {"device": device_summary(), "config": config, "runs": runs}
    json_path = os.path.join(out_dir, name + ".json")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1)

    # Both backends compute the same function, so their curves should lie on top of each
    # other: jaxgemm's is drawn wide and pale, XLA's thin over it.
    colors = {"jaxgemm": "tab:orange", "xla": "tab:blue"}
    widths, markers = {"jaxgemm": 4.0, "xla": 1.2}, {"jaxgemm": "o", "xla": "x"}
    fig, (ax_loss, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    for backend, run in runs.items():
        steps, losses = zip(*run["curve"])
        label = f"{backend}: train loss" + (f" ({run['summary']})" if run.get("summary") else "")
        ax_loss.plot(steps, losses, color=colors.get(backend), lw=widths.get(backend, 1.2),
                     alpha=0.6 if backend == "jaxgemm" else 1.0, label=label)
        if run.get("eval"):
            es, ev = zip(*run["eval"])
            ax_loss.plot(es, ev, "--", marker=markers.get(backend, "o"), color=colors.get(backend), ms=6, lw=1,
                         label=f"{backend}: {run['eval_name']}")
    for label, y in config.get("reference_lines", {}).items():
        ax_loss.axhline(y, color="gray", ls=":", lw=1)
        ax_loss.annotate(label, (0.99, y), xycoords=("axes fraction", "data"), ha="right", va="bottom",
                         fontsize=8, color="gray")
    if log_y:
        ax_loss.set_yscale("log")
        ax_loss.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax_loss.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss (nats)")
    ax_loss.set_title("training curves (same init, same data order)")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend(fontsize=8)

    backends = list(runs)
    ms = [runs[b]["step_ms"] for b in backends]
    bars = ax_time.bar(backends, ms, color=[colors.get(b) for b in backends])
    for bar, t in zip(bars, ms):
        rate = throughput_per_step / (t / 1e3)
        ax_time.annotate(f"{t:.1f} ms\n{rate:,.0f} {throughput_unit}", (bar.get_x() + bar.get_width() / 2, t),
                         ha="center", va="bottom", fontsize=9)
    ax_time.set_ylabel("median step time (ms)")
    ax_time.set_ylim(0, max([t for t in ms if t == t], default=1.0) * 1.3)  # NaN: no step was timed
    ax_time.set_title(report["device"], fontsize=10)
    fig.suptitle(name)
    fig.tight_layout()
    png_path = os.path.join(out_dir, name + ".png")
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return json_path, png_path
