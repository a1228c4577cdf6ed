"""What train_lm.py and train_cnn.py share: the command line, the training loop (`train`),
data-parallel placement, the step timer, checkpoints, and the --compare report (a PNG and a
JSON), and the dense layer both models use (`Dense`: jaxgemm.dense or XLA's ops). Each
example keeps its data, its model, its loss and its config.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import json
import os
import shutil
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from tqdm import tqdm

import jaxgemm
import jaxgemm.flax as jf

# ---------------------------------------------------------------------------------------
# Command line: the flags both examples take; each adds its data's (and its own) flags.


def parser(doc, sizes, backends=("jaxgemm", "xla")):
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--backend", choices=backends, default="jaxgemm")
    parser.add_argument("--compare", nargs="?", const=("jaxgemm", "xla"), type=_backend_list(backends),
                        metavar="BACKENDS", help="train with several backends (comma-separated; alone: jaxgemm,xla) "
                        "and write a PNG and a JSON of their curves and step times")  # fmt: skip
    parser.add_argument("--size", choices=tuple(sizes), default="cpu")
    parser.add_argument("--steps", type=int, help="default: the size's")
    parser.add_argument("--batch-size", type=int, help="global batch (split over the devices); default: the size's")
    parser.add_argument("--lr", type=float, help="peak learning rate; default: the size's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs", help="folder for checkpoints, the PNG and the JSON")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    parser.add_argument("--ckpt-every", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--log-every", type=int, default=10)
    return parser


def _backend_list(known):
    """--compare's argument: two or more distinct names of `known`, comma-separated."""

    def parse(text):
        names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
        unknown = [name for name in names if name not in known]
        if unknown or len(names) < 2:
            raise argparse.ArgumentTypeError(f"needs two or more of {', '.join(known)}, comma-separated; got {text!r}")
        return names

    return parse


def config(args, sizes):
    """The --size's config, with --steps, --batch-size and --lr where given."""
    overrides = {k: getattr(args, k) for k in ("steps", "batch_size", "lr") if getattr(args, k)}
    return dataclasses.replace(sizes[args.size], **overrides)


def backends(parser, args):
    """The backends to train: --compare's, else --backend alone (which --compare's list replaces)."""
    if args.compare and args.backend != "jaxgemm":
        parser.error(f"--compare names the backends it trains: put {args.backend} in its list "
                     f"(--compare jaxgemm,{args.backend}) instead of --backend {args.backend}")  # fmt: skip
    return args.compare or (args.backend,)


def compare_name(base, backends):
    """The --compare report's file name: base_compare for jaxgemm against XLA, else
    base_compare_<backend>_<backend>..."""
    return f"{base}_compare" if tuple(backends) == ("jaxgemm", "xla") else f"{base}_compare_" + "_".join(backends)


# ---------------------------------------------------------------------------------------
# The dense layer of both models.

# --backend xla's activations: jax.nn's, whose gelu is the tanh form, as jaxgemm's "gelu".
XLA_ACTIVATIONS = {None: lambda y: y, "relu": jax.nn.relu, "gelu": jax.nn.gelu}
# The fp8 backends' scaling (jaxgemm.fp8.dense), and their dz format where not e4m3
# (fp8-hybrid: delayed scaling with e5m2 gradients, TransformerEngine's default recipe).
FP8_SCALING = {"fp8": "rowwise", "fp8-blockwise": "blockwise", "fp8-delayed": "delayed",
               "fp8-hybrid": "delayed"}  # fmt: skip
FP8_GRAD_FORMAT = {"fp8-hybrid": "e5m2"}


class Dense(nnx.Module):
    """activation(x @ w + b): one fused jaxgemm.dense kernel, plain XLA ops (--backend xla),
    or jaxgemm.fp8.dense (--backend fp8: e4m3 products, rowwise scaled, forward and
    backward; fp8-blockwise: in 1 x 128 blocks, the weights in 128 x 128 tiles;
    fp8-delayed: one scale per tensor from its amax history, kept in an Fp8History
    variable that update_step writes; fp8-hybrid: the same with dz in e5m2). Float32
    master weights, cast with the input to the compute dtype."""

    def __init__(self, d_in, d_out, *, backend, dtype, rngs, activation=None, std=0.02):
        self.w = nnx.Param(std * jax.random.normal(rngs.params(), (d_in, d_out)))
        self.b = nnx.Param(jnp.zeros((d_out,)))
        self.backend, self.dtype, self.activation = backend, dtype, activation
        if FP8_SCALING.get(backend) == "delayed":
            self.history = jf.Fp8History(jnp.stack(jaxgemm.fp8.amax_history()))

    def __call__(self, x):
        x, w, b = x.astype(self.dtype), self.w[...].astype(self.dtype), self.b[...].astype(self.dtype)
        if self.backend == "jaxgemm":
            return jaxgemm.dense(x, w, b, activation=self.activation)
        if self.backend in FP8_SCALING:
            history = jaxgemm.fp8.AmaxHistory(*self.history[...]) if hasattr(self, "history") else None
            grad_format = FP8_GRAD_FORMAT.get(self.backend, "e4m3")
            return jaxgemm.fp8.dense(x, w, b, activation=self.activation, scaling=FP8_SCALING[self.backend],
                                     history=history, grad_format=grad_format)  # fmt: skip
        return XLA_ACTIVATIONS[self.activation](x @ w + b)


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
# The training loop.


def update_step(loss_fn):
    """A jitted step (model, optimizer, *batch) -> loss: one gradient of loss_fn, one update
    (fp8-delayed's histories written from their gradient, the parameters' by the optimizer)."""

    def step(model, optimizer, *batch):
        loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, jf.FP8_TRAINABLE))(model, *batch)
        optimizer.update(model, jf.write_fp8_histories(model, grads))
        return loss

    return nnx.jit(step)


class Prefetcher:
    """batch(step) for the steps [start, stop), made `depth` steps ahead on a worker thread
    (numpy's loops release the GIL), so that the host makes the next batches while the
    device runs this step; the time each batch took to make is kept in `seconds`."""

    def __init__(self, batch, start, stop, depth=2):
        self._batch, self._next, self._stop, self.seconds = batch, start, stop, []
        self._pool = concurrent.futures.ThreadPoolExecutor(1)
        self._pending = collections.deque()
        for _ in range(depth):
            self._submit()

    def _submit(self):
        if self._next < self._stop:
            self._pending.append(self._pool.submit(self._timed, self._next))
            self._next += 1

    def _timed(self, step):
        t0 = time.perf_counter()
        arrays = self._batch(step)
        self.seconds.append(time.perf_counter() - t0)
        return arrays

    def next(self):
        """The next step's batch (an error in making it is raised here)."""
        arrays = self._pending.popleft().result()
        self._submit()
        return arrays

    def close(self):
        self._pool.shutdown(cancel_futures=True)


def train(model, tx, loss_fn, batch, evaluate, *, steps, mesh, args, label, ckpt_dir, throughput, eval_name):
    """Trains `model` with the optax `tx` on `loss_fn(model, *batch(step))` for `steps` steps.

    batch(step): that step's host arrays; a function of the step alone, so that both backends
    of --compare, and a resumed run, see the same data. evaluate(model): {name: value}, its
    held-out loss under `eval_name`. throughput: (items per step, unit), e.g. (2048, "tokens").
    Logs every --log-every steps, evaluates every --eval-every, checkpoints to ckpt_dir every
    --ckpt-every (--resume: restores the last first). Returns the run: {"curve": [[step, train
    loss], ...], "eval": [[step, held-out loss], ...], "eval_name", one such list for each of
    evaluate's other values, "step_ms", "<unit>_per_s", "batch_ms" (the host's median time to
    make one step's batch, on a thread beside the steps: Prefetcher), "wall_s", "steps_run"}.
    """
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    replicate(mesh, model, optimizer)
    print(f"[{label}] {param_count(model):,} parameters")
    ckpt = Checkpointer(ckpt_dir, fresh=not args.resume)
    start, history = restore(ckpt, model, optimizer, label) if args.resume else (0, {"curve": []})

    step_fn = nnx.cached_partial(update_step(loss_fn), model, optimizer)  # skips re-walking the module graph
    sharding, (items, unit) = NamedSharding(mesh, P("data")), throughput
    timer, window, t_start, batches = StepTimer(), [], time.perf_counter(), Prefetcher(batch, start, steps)
    bar = tqdm(range(start, steps), initial=start, total=steps, desc=f"{label:>7}", dynamic_ncols=True)
    for step in bar:
        window.append(step_fn(*jax.device_put(batches.next(), sharding)))
        done = step + 1
        if done == start + 1 or done % args.log_every == 0 or done == steps:
            loss = float(np.mean(jax.device_get(window)))  # waits for the window's steps to finish
            per_step, window = timer.lap(done), []
            history["curve"].append([done, loss])
            rate = {f"{unit}/s": f"{items / per_step:,.0f}"} if per_step else {}
            bar.set_postfix({"loss": f"{loss:.3f}"} | rate)
        if done % args.eval_every == 0 or done == steps:
            metrics = evaluate(model)
            for name, value in metrics.items():
                history.setdefault("eval" if name == eval_name else name, []).append([done, value])
            bar.write(f"[{label}] step {done}: " + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items()))
        if done % args.ckpt_every == 0 or done == steps:
            ckpt.save(done, (model, optimizer), {"step": done, "history": history})
        if done % args.eval_every == 0 or done % args.ckpt_every == 0:
            timer.restart(done)  # leave evaluation and checkpoint time out of the step time
    bar.close()
    batches.close()
    ckpt.wait()
    batch_ms = statistics.median(batches.seconds) * 1e3 if batches.seconds else float("nan")
    return history | {"eval_name": eval_name, "step_ms": timer.median() * 1e3, f"{unit}_per_s": items / timer.median(),
                      "batch_ms": batch_ms, "wall_s": time.perf_counter() - t_start, "steps_run": steps - start}


def restore(ckpt, model, optimizer, label):
    """(step, history) of the last checkpoint in `ckpt`, loaded into model and optimizer;
    (0, a new history) where there is none."""
    if ckpt.latest_step() is None:
        return 0, {"curve": []}
    meta = ckpt.restore(ckpt.latest_step(), (model, optimizer))
    print(f"[{label}] resumed from step {meta['step']} ({ckpt.kind} checkpoint in {ckpt.directory})")
    return meta["step"], meta["history"]


# ---------------------------------------------------------------------------------------
# The --compare report.


def device_summary():
    d = jax.devices()[0]
    return f"{jax.device_count()} x {getattr(d, 'device_kind', d.platform)} ({jax.default_backend()})"


def write_compare(out_dir, name, runs, config, throughput_unit, throughput_per_step, log_y=False, device=None):
    """runs: {backend: {"curve": [[step, loss], ...], "eval": [[step, loss], ...],
    "eval_name": str, "summary": str, "step_ms": float, ...}}. Writes out_dir/name.json and
    name.png (the train loss of every backend on one axis, their held-out losses dashed; the
    median step time and throughput side by side); returns the two paths. `device` names
    the machine (default: this process's devices; a plot redrawn from a JSON passes its own)."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    report = {"device": device or device_summary(), "config": config, "runs": runs}
    json_path = os.path.join(out_dir, name + ".json")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1)

    # jaxgemm and XLA compute the same function, so their curves should lie on top of each
    # other: jaxgemm's is drawn wide and pale, the others thin over it.
    colors = {"jaxgemm": "tab:orange", "xla": "tab:blue", "fp8": "tab:green", "fp8-blockwise": "tab:red",
              "fp8-delayed": "tab:purple", "fp8-hybrid": "tab:brown"}
    widths = {"jaxgemm": 4.0}
    markers = {"jaxgemm": "o", "xla": "x", "fp8": "^", "fp8-blockwise": "v", "fp8-delayed": "s", "fp8-hybrid": "D"}
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
        # "%g": 0.0001, not ScalarFormatter's fixed three decimals ("0.000").
        ax_loss.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}"))
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


def report_compare(out_dir, name, runs, config, unit, items_per_step, log_y=False):
    """Prints each backend's median step time against XLA's (or the first backend's where
    XLA did not run), then writes name.{json,png}."""
    base = "xla" if "xla" in runs else next(iter(runs))
    for backend in (b for b in runs if b != base):
        ratio = runs[backend]["step_ms"] / runs[base]["step_ms"]
        print(f"step time {backend} / {base}: {ratio:.3f} ({backend} at {1 / ratio:.2f}x {base}'s {unit}/s)")
    # A step can go no faster than the host makes its batch: near that bound the ratio
    # compares the input pipelines more than the kernels.
    batch_ms = max(run.get("batch_ms", 0.0) for run in runs.values())
    if batch_ms >= 0.8 * min(run["step_ms"] for run in runs.values()):
        print(f"note: the host takes {batch_ms:.1f} ms to make a batch, near the step time: the steps may wait "
              "on the host (tools/example_kernels.py times the GPU's part alone)")
    paths = write_compare(out_dir, name, runs, config, f"{unit}/s", items_per_step, log_y=log_y)
    print("wrote " + " and ".join(paths))
