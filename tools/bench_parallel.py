"""jaxgemm against plain jax.numpy (XLA) when the work is sharded over 1, 2, 4 devices.

Three workloads, each built with jaxgemm and with `activation(x @ w + b)` in jnp
(jax.nn.gelu: its tanh form, as jaxgemm's "gelu"), on the same inputs:
  dp  data-parallel training step: an MLP of 4 dense layers 8192 -> 8192 (bf16, gelu
      between layers, none after the last), global batch 16384 sharded P("data", None),
      parameters replicated; loss = mean(out^2), jax.value_and_grad, then SGD.
  tp  Megatron-style tensor-parallel MLP block, forward + backward:
      y = dense(gelu(dense(x, w1, b1)), w2, b2), d_model 8192, hidden 28672, 8192 tokens,
      bf16; w1 P(None, "model"), b1 P("model"), w2 P("model", None), x and b2 replicated;
      the gradient of sum(y^2) with respect to x, w1, b1, w2 and b2.
  sp  the same block with sequence parallelism, inside shard_map: the tokens split
      P("model", None), gathered before the first layer and the output reduce-scattered
      back to them; jaxgemm.all_gather_matmul / matmul_reduce_scatter (rings of transfers
      beside the products) against lax.all_gather / psum_scatter around jnp's products.
For each device count n, a mesh of the first n devices; both backends jitted with
NamedSharding in/out shardings, warmed up, then timed in wall clock (block_until_ready)
in alternating order, median of --iters calls each. Also printed: speedup over 1 device,
the collectives in each compiled HLO, and how far jaxgemm's results are from XLA's
(dp: loss and gradient norm; tp: the gradients). Sizes are strong scaling: the same
global problem at every n. On CPU (or with --small) the sizes shrink to a smoke test.
    python3 -P tools/bench_parallel.py --devices 1,2,4 [--workload dp|tp|all] [--iters 20] [--json PATH]
                                       [--plot PNG] [--from JSON: draw an earlier run's rows]
CPU smoke test:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python3 -P tools/bench_parallel.py --iters 3"""

import argparse
import dataclasses
import json
import re
import statistics
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemm

DTYPE = jnp.bfloat16
LEARNING_RATE = 1e-3
WARMUP = 2
BACKENDS = ("xla", "jaxgemm")
COLLECTIVES = {"all-gather": "ag", "all-reduce": "ar", "reduce-scatter": "rs", "all-to-all": "a2a",
               "collective-permute": "cp"}
# An instruction `%name = shape op(...)`; an async pair counts once, by its -start.
COLLECTIVE_OP = re.compile(r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")


@dataclasses.dataclass(frozen=True)
class Sizes:
    layers: int  # dp
    width: int
    batch: int
    d_model: int  # tp
    hidden: int
    tokens: int


FULL = Sizes(layers=4, width=8192, batch=16384, d_model=8192, hidden=28672, tokens=8192)
SMALL = Sizes(layers=2, width=256, batch=512, d_model=256, hidden=512, tokens=512)


def log(message):
    print(message, file=sys.stderr, flush=True)


def xla_dense(x, w, b, activation):
    y = x @ w + b
    return jax.nn.gelu(y) if activation == "gelu" else y


def jaxgemm_dense(x, w, b, activation):
    return jaxgemm.dense(x, w, b, activation=activation)


DENSE = {"xla": xla_dense, "jaxgemm": jaxgemm_dense}


def xla_sp_block(x, w1, b1, w2, b2):
    h = xla_dense(jax.lax.all_gather(x, "model", tiled=True), w1, b1, "gelu")
    return jax.lax.psum_scatter(h @ w2, "model", tiled=True) + b2


def jaxgemm_sp_block(x, w1, b1, w2, b2):
    h = jaxgemm.all_gather_matmul(x, w1, "model", bias=b1, activation="gelu")
    return jaxgemm.matmul_reduce_scatter(h, w2, "model", bias=b2)


SP_BLOCK = {"xla": xla_sp_block, "jaxgemm": jaxgemm_sp_block}


def init_dense(key, fan_in, fan_out):
    kw, kb = jax.random.split(key)
    w = jax.random.normal(kw, (fan_in, fan_out), DTYPE) * fan_in**-0.5
    b = 0.1 * jax.random.normal(kb, (fan_out,), DTYPE)
    return w, b


def dp_inputs(s: Sizes, key):
    keys = jax.random.split(key, s.layers + 1)
    params = [init_dense(k, s.width, s.width) for k in keys[:-1]]
    x = jax.random.normal(keys[-1], (s.batch, s.width), DTYPE)
    return (params, x), (P(), P("data", None))


def dp_step(backend):
    dense = DENSE[backend]

    def loss(params, x):
        h = x
        for i, (w, b) in enumerate(params):
            h = dense(h, w, b, "gelu" if i < len(params) - 1 else None)
        return jnp.mean(jnp.square(h.astype(jnp.float32)))

    def step(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        new_params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
        grad_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads)))
        return new_params, {"loss": value, "grad_norm": grad_norm}

    return step


def tp_inputs(s: Sizes, key):
    kx, k1, k2 = jax.random.split(key, 3)
    x = jax.random.normal(kx, (s.tokens, s.d_model), DTYPE)
    w1, b1 = init_dense(k1, s.d_model, s.hidden)
    w2, b2 = init_dense(k2, s.hidden, s.d_model)
    return (x, w1, b1, w2, b2), (P(), P(None, "model"), P("model"), P("model", None), P())


def tp_grad(backend):
    dense = DENSE[backend]

    def loss(x, w1, b1, w2, b2):
        y = dense(dense(x, w1, b1, "gelu"), w2, b2, None)
        return jnp.sum(jnp.square(y.astype(jnp.float32)))

    return jax.grad(loss, argnums=(0, 1, 2, 3, 4))


# The sequence-parallel block's shard_map specs: tp's, with the tokens split.
SP_SPECS = (P("model", None), P(None, "model"), P("model"), P("model", None), P())


def sp_inputs(s: Sizes, key):
    return tp_inputs(s, key)[0], SP_SPECS


def sp_grad(backend):
    """The block's gradient; its shard_map takes the mesh of the context (run_case's)."""
    block = jax.shard_map(SP_BLOCK[backend], in_specs=SP_SPECS, out_specs=P("model", None))

    def loss(*args):
        return jnp.sum(jnp.square(block(*args).astype(jnp.float32)))

    return jax.grad(loss, argnums=(0, 1, 2, 3, 4))


@dataclasses.dataclass(frozen=True)
class Workload:
    axis: str
    inputs: Callable  # (Sizes, key) -> (args, PartitionSpec prefix of args)
    build: Callable  # backend name -> function of args
    out_specs: Callable  # in specs -> PartitionSpec prefix of the outputs
    checked: Callable  # outputs -> the part compared between backends


WORKLOADS = {
    "dp": Workload("data", dp_inputs, dp_step, lambda specs: (specs[0], P()), lambda out: out[1]),
    "tp": Workload("model", tp_inputs, tp_grad, lambda specs: specs, lambda out: out),
    "sp": Workload("model", sp_inputs, sp_grad, lambda specs: specs, lambda out: out),
}


def count_collectives(hlo: str) -> dict:
    counts = dict.fromkeys(COLLECTIVES, 0)
    for line in hlo.splitlines():
        match = COLLECTIVE_OP.search(line) if " = " in line else None
        if match:
            counts[match.group(1)] += 1
    return counts


def relative_difference(out, ref) -> float:
    """Largest ||out - ref|| / ||ref|| over the leaves, in float32."""
    def rel(a, b):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), np.finfo(np.float32).tiny))

    return max(jax.tree.leaves(jax.tree.map(rel, out, ref)))


def time_alternating(fns: dict, args, iters: int) -> dict:
    """Median wall-clock ms per call; the order of the backends reverses every iteration."""
    samples = {name: [] for name in fns}
    names = list(fns)
    for i in range(iters):
        for name in names if i % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            jax.block_until_ready(fns[name](*args))
            samples[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in samples.items()}


def shardings(workload: Workload, specs, n: int):
    """(in, out) NamedShardings of `workload` on an Auto mesh of the first n devices."""
    mesh = Mesh(np.array(jax.devices()[:n]), (workload.axis,), axis_types=(AxisType.Auto,))
    named = lambda tree: jax.tree.map(lambda spec: NamedSharding(mesh, spec), tree)  # noqa: E731
    return named(specs), named(workload.out_specs(specs))


def mesh_of(named_shardings):
    return jax.tree.leaves(named_shardings)[0].mesh


def compile_case(workload: Workload, backend: str, in_shardings, out_shardings, args):
    """The backend's build of `workload`, jitted with these shardings and compiled (under
    their mesh: sp's shard_map takes it from the context)."""
    jitted = jax.jit(workload.build(backend), in_shardings=in_shardings, out_shardings=out_shardings)
    with jax.set_mesh(mesh_of(in_shardings)):
        return jitted.lower(*args).compile()


def run_case(name: str, workload: Workload, inputs, specs, n: int, iters: int) -> dict:
    """Compiles, checks and times both backends on a mesh of the first n devices."""
    in_shardings, out_shardings = shardings(workload, specs, n)
    args = jax.device_put(inputs, in_shardings)
    compiled, results, outputs = {}, {}, {}
    for backend in BACKENDS:
        tag = f"[{name} n={n} {backend}]"
        try:
            log(f"{tag} compiling")
            fn = compile_case(workload, backend, in_shardings, out_shardings, args)
            results[backend] = {"collectives": count_collectives(fn.as_text())}
            log(f"{tag} warming up")
            for _ in range(WARMUP):
                out = jax.block_until_ready(fn(*args))
        except Exception as e:  # a backend that fails is reported; the other is still timed
            first_line = (str(e).strip().splitlines() or [""])[0]
            log(f"{tag} FAILED: {type(e).__name__}: {first_line}")
            results[backend] = {"error": f"{type(e).__name__}: {first_line}"}
            continue
        compiled[backend] = fn
        outputs[backend] = jax.device_get(workload.checked(out))
    log(f"[{name} n={n}] timing {', '.join(compiled)} ({iters} iterations each)")
    for backend, ms in time_alternating(compiled, args, iters).items():
        results[backend]["ms"] = ms
    diff = relative_difference(outputs["jaxgemm"], outputs["xla"]) if len(outputs) == 2 else None
    return {"workload": name, "devices": n, "rel_diff": diff, **results}


def add_ratios(rows: list) -> None:
    """XLA ms / jaxgemm ms, and each backend's speedup over its own 1-device time."""
    single = {(r["workload"], b): r[b].get("ms") for r in rows if r["devices"] == 1 for b in BACKENDS}
    for r in rows:
        xla, ours = r["xla"].get("ms"), r["jaxgemm"].get("ms")
        r["ratio_xla_over_jaxgemm"] = xla / ours if xla and ours else None
        for b in BACKENDS:
            base, ms = single.get((r["workload"], b)), r[b].get("ms")
            r[b]["speedup_vs_1"] = base / ms if base and ms else None


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def fmt_collectives(result: dict) -> str:
    if "error" in result:
        return "failed"
    text = " ".join(f"{COLLECTIVES[op]}{k}" for op, k in result["collectives"].items() if k)
    return text or "none"


def print_table(rows: list) -> None:
    header = ("workload", "dev", "XLA ms", "jaxgemm ms", "XLA/jaxgemm", "XLA vs 1", "jaxgemm vs 1",
              "XLA collectives", "jaxgemm collectives", "rel diff")
    table = [header] + [
        (r["workload"], str(r["devices"]), fmt(r["xla"].get("ms"), ".2f"), fmt(r["jaxgemm"].get("ms"), ".2f"),
         fmt(r["ratio_xla_over_jaxgemm"], ".3f"), fmt(r["xla"].get("speedup_vs_1"), ".2f"),
         fmt(r["jaxgemm"].get("speedup_vs_1"), ".2f"), fmt_collectives(r["xla"]), fmt_collectives(r["jaxgemm"]),
         fmt(r["rel_diff"], ".1e"))
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.rjust(w) if i > 0 else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    print("XLA/jaxgemm > 1: jaxgemm faster.  vs 1: speedup over the same backend on 1 device.  collectives: "
          + ", ".join(f"{a} {op}" for op, a in COLLECTIVES.items())
          + ".  rel diff: largest ||jaxgemm - XLA|| / ||XLA|| of the checked outputs.")
    for r in rows:
        for b in BACKENDS:
            if "error" in r[b]:
                print(f"{r['workload']} n={r['devices']} {b} failed: {r[b]['error']}")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", default="1,2,4", help="device counts, comma-separated (default 1,2,4)")
    parser.add_argument("--workload", choices=("dp", "tp", "sp", "all"), default="all")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per backend (default 20)")
    parser.add_argument("--small", action="store_true", help="smoke-test sizes (automatic on CPU)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--plot", metavar="PNG", help="draw step times and ratios (needs matplotlib)")
    parser.add_argument("--from", dest="from_json", metavar="JSON", help="no run: draw --plot from this --json file")
    return parser.parse_args()


def plot(rows: list, meta: dict, path: str) -> None:
    """Per workload: each backend's step time by device count, and XLA / jaxgemm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(1, len(workloads) + 1, figsize=(4.2 * (len(workloads) + 1), 3.6))
    titles = {"dp": "data-parallel step", "tp": "tensor-parallel block", "sp": "sequence-parallel block"}
    for ax, name in zip(axes, workloads):
        sel = [r for r in rows if r["workload"] == name]
        xs = [r["devices"] for r in sel]
        for backend in BACKENDS:
            ax.plot(xs, [r[backend].get("ms") for r in sel], "o-", label=backend)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("GPUs")
        ax.set_ylabel("ms per step")
        ax.set_title(titles.get(name, name))
        ax.legend()
    ratio = axes[-1]
    for name in workloads:
        sel = [r for r in rows if r["workload"] == name]
        ratio.plot([r["devices"] for r in sel], [r["ratio_xla_over_jaxgemm"] for r in sel], "o-", label=name)
    ratio.axhline(1.0, color="gray", lw=1)
    values = [r["ratio_xla_over_jaxgemm"] for r in rows if r["ratio_xla_over_jaxgemm"]]
    ratio.set_ylim(min([0.9, *values]) - 0.02, max([1.1, *values]) + 0.02)  # noise is a few %: don't magnify it
    ratio.set_xscale("log", base=2)
    ratio.set_xticks(sorted({r["devices"] for r in rows}), [str(x) for x in sorted({r["devices"] for r in rows})])
    ratio.set_xlabel("GPUs")
    ratio.set_ylabel("XLA time / jaxgemm time")
    ratio.set_title("> 1: jaxgemm faster")
    ratio.legend()
    fig.suptitle(f"jaxgemm vs XLA, {meta['device_kind']}, jax {meta['jax']}, median of {meta['iters']} steps")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    args = parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        plot(saved["results"], saved["meta"], args.plot or "bench_parallel.png")
        return
    available = len(jax.devices())
    counts = [int(c) for c in args.devices.split(",")]
    skipped = [c for c in counts if c > available]
    counts = [c for c in counts if c <= available]
    if skipped:
        log(f"skipping device counts {skipped}: only {available} devices")
    small = args.small or jax.default_backend() == "cpu"
    sizes = SMALL if small else FULL
    if jax.default_backend() == "cpu":
        print(f"note: no GPU (backend cpu, {available} devices): small sizes, a smoke test, timings mean nothing")
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind} x{available}, {sizes}, {args.iters} iterations")
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    rows = []
    for name in names:
        workload = WORKLOADS[name]
        inputs, specs = workload.inputs(sizes, jax.random.key(0))
        for n in counts:
            rows.append(run_case(name, workload, inputs, specs, n, args.iters))
    add_ratios(rows)
    print_table(rows)
    meta = {"jax": jax.__version__, "backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
            "iters": args.iters, "sizes": dataclasses.asdict(sizes)}
    if args.plot:
        plot(rows, meta, args.plot)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
