"""Benchmark: jaxgemm's GEMMs vs XLA on the same inputs, in one process.

    python -m jaxgemm.bench [--suite simt,tc,epilogue,smoke,all] [--iterations 50] [--json out.json]
    (= python -m jaxgemm.bench.gemm)

Kernel time comes from CUPTI (`jax.experimental.mosaic.gpu.profiler.measure`): the sum of
the kernels one call launches, median over iterations. Ours and the baseline are timed in
alternating rounds, so a drift of the GPU's clock favours neither. Without CUPTI (e.g. on
a CPU) the median wall-clock time of a jitted call is used, and the table says so. `base/ours` > 1
means jaxgemm is faster than the baseline (XLA, unless the row says otherwise).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

import jaxgemm
from jaxgemm import activations
from jaxgemm.bench import rel_error, time_pair_ms


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    m: int
    n: int
    k: int
    dtype: str = "float32"
    transpose_a: bool = False
    transpose_b: bool = False
    precision: str | None = None  # jaxgemm's and XLA's precision for float32
    # "matmul": vs XLA's dot; "fused": matmul + bias + activation + aux vs jaxgemm's plain
    # matmul; "dense" / "dense_f32acc": dense forward + backward vs XLA, in the input dtype
    # or with preferred_element_type=float32 then a cast; "pallas": matmul vs JAX's Pallas
    # Mosaic-GPU Hopper matmul.
    kind: str = "matmul"
    activation: str | None = None

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * (3 if self.kind.startswith("dense") else 1)

    @property
    def baseline(self) -> str:
        return {"fused": "jaxgemm plain", "dense_f32acc": "XLA f32-acc", "pallas": "Pallas MGPU"}.get(self.kind, "XLA")


def _simt_suite() -> list[Case]:
    cases = [Case(f"f32 {s}^3", s, s, s) for s in (4096, 8192)]
    cases += [Case(f"f32 K=1024 M=N={s}", s, s, 1024) for s in (2048, 4096, 8192, 16384)]
    cases.append(Case("f32 ragged", 4095, 4097, 4093))
    for ta, tb in ((True, False), (False, True), (True, True)):
        tag = ("T" if ta else "N") + ("T" if tb else "N")
        cases.append(Case(f"f32 4096^3 {tag}", 4096, 4096, 4096, transpose_a=ta, transpose_b=tb))
    cases.append(Case("f32 tall-skinny", 128, 8192, 8192))
    return cases


def _tensor_core_suite() -> list[Case]:
    """The tensor-core targets (bf16 and f16 large products), their layouts, tf32 and few rows."""
    shapes = {
        "8192^3": (8192, 8192, 8192),
        "4096x8192x4096": (4096, 8192, 4096),
        "16384x4096x14336": (16384, 4096, 14336),
        "4096^3": (4096, 4096, 4096),
        "2048^3": (2048, 2048, 2048),
    }
    cases = [
        Case(f"{short} {name}", m, n, k, d)
        for d, short in (("bfloat16", "bf16"), ("float16", "f16"))
        for name, (m, n, k) in shapes.items()
    ]
    for ta, tb in ((False, True), (True, False), (True, True)):
        tag = ("T" if ta else "N") + ("T" if tb else "N")
        cases.append(Case(f"bf16 8192^3 {tag}", 8192, 8192, 8192, "bfloat16", transpose_a=ta, transpose_b=tb))
    cases.append(Case("bf16 ragged", 8191, 8193, 8190, "bfloat16"))
    # tf32: float32 with precision="tensorfloat32", against XLA's default f32 precision.
    for name, (m, n, k) in (("8192^3", (8192,) * 3), ("4096^3", (4096,) * 3)):
        cases.append(Case(f"tf32 {name}", m, n, k, precision="tensorfloat32"))
    for ta, tb in ((False, True), (True, True), (True, False)):
        tag = ("T" if ta else "N") + ("T" if tb else "N")
        cases.append(Case(f"tf32 8192^3 {tag}", 8192, 8192, 8192, precision="tensorfloat32", transpose_a=ta,
                          transpose_b=tb))
    cases += [Case(f"bf16 M={m} N=K=8192", m, 8192, 8192, "bfloat16") for m in (16, 128)]
    cases.append(Case("f16 8192^3", 8192, 8192, 8192, "float16", kind="pallas"))
    return cases


SUITES: dict[str, Callable[[], list[Case]]] = {
    "smoke": lambda: [Case("f32 1024^3", 1024, 1024, 1024), Case("bf16 1024^3", 1024, 1024, 1024, "bfloat16"),
                      Case("f32 512^3 dense gelu", 512, 512, 512, kind="dense", activation="gelu")],
    "simt": _simt_suite,
    "tc": _tensor_core_suite,
}
SUITES["epilogue"] = lambda: [
    Case("f32 4096^3 bias+gelu+aux", 4096, 4096, 4096, kind="fused", activation="gelu"),
    Case("bf16 4096^3 bias+gelu+aux", 4096, 4096, 4096, "bfloat16", kind="fused", activation="gelu"),
    Case("bf16 8192^3 bias+gelu+aux", 8192, 8192, 8192, "bfloat16", kind="fused", activation="gelu"),
    Case("bf16 4096^3 dense gelu", 4096, 4096, 4096, "bfloat16", kind="dense", activation="gelu"),
    Case("bf16 4096^3 dense gelu", 4096, 4096, 4096, "bfloat16", kind="dense_f32acc", activation="gelu"),
    Case("bf16 4096^3 dense relu", 4096, 4096, 4096, "bfloat16", kind="dense", activation="relu"),
    Case("f32 4096^3 dense gelu", 4096, 4096, 4096, kind="dense", activation="gelu"),
    # Issue 5's sizes: power-capped, where the fused epilogues' saved traffic is also clock.
    Case("bf16 8192^3 dense gelu", 8192, 8192, 8192, "bfloat16", kind="dense", activation="gelu"),
    Case("bf16 8192^3 dense gelu", 8192, 8192, 8192, "bfloat16", kind="dense_f32acc", activation="gelu"),
    Case("bf16 8192^3 dense relu", 8192, 8192, 8192, "bfloat16", kind="dense", activation="relu"),
]
SUITES["all"] = lambda: SUITES["simt"]() + SUITES["tc"]() + SUITES["epilogue"]()


def _xla_precision(case: Case):
    """XLA's side: exact fp32 for exact cases; for tf32 cases XLA's default f32 precision
    (tf32 on cuBLAS)."""
    if case.dtype != "float32" or case.precision == "tensorfloat32":
        return None
    return "highest"


def _inputs(case: Case, seed: int):
    ka, kb, kc, kd = jax.random.split(jax.random.key(seed), 4)
    dtype = jnp.dtype(case.dtype)
    if case.kind.startswith("dense"):
        return (
            jax.random.normal(ka, (case.m, case.k), dtype),
            jax.random.normal(kb, (case.k, case.n), dtype) / float(np.sqrt(case.k)),
            jax.random.normal(kc, (case.n,), dtype),
            jax.random.normal(kd, (case.m, case.n), dtype),
        )
    a_shape = (case.k, case.m) if case.transpose_a else (case.m, case.k)
    b_shape = (case.n, case.k) if case.transpose_b else (case.k, case.n)
    a, b = jax.random.normal(ka, a_shape, dtype), jax.random.normal(kb, b_shape, dtype)
    return (a, b, jax.random.normal(kc, (case.n,), dtype)) if case.kind == "fused" else (a, b)


def _dense_fwd_bwd(layer):
    def run(x, w, bias, ct):
        y, vjp = jax.vjp(layer, x, w, bias)
        return y, vjp(ct)

    return run


def _functions(case: Case):
    """(ours, baseline), both jitted, taking _inputs(case)."""
    act = functools.partial(activations.apply, case.activation)
    if case.kind == "fused":
        fused = lambda a, b, bias: jaxgemm.matmul(a, b, bias=bias, activation=case.activation, return_pre_activation=True)  # noqa: E731
        plain = lambda a, b, bias: jaxgemm.matmul(a, b)  # noqa: E731
        return jax.jit(fused), jax.jit(plain)
    if case.kind.startswith("dense"):
        ours = _dense_fwd_bwd(lambda x, w, b: jaxgemm.dense(x, w, b, case.activation))
        if case.kind == "dense":
            xla = _dense_fwd_bwd(lambda x, w, b: act(jnp.dot(x, w, precision=_xla_precision(case)) + b))
        else:
            xla = _dense_fwd_bwd(
                lambda x, w, b: act(jnp.dot(x, w, preferred_element_type=jnp.float32) + b).astype(x.dtype)
            )
        return jax.jit(ours), jax.jit(xla)

    if case.kind == "pallas":
        return jax.jit(lambda a, b: jaxgemm.matmul(a, b)), _pallas_hopper_matmul()

    def ours(a, b):
        return jaxgemm.matmul(
            a, b, transpose_a=case.transpose_a, transpose_b=case.transpose_b, precision=case.precision
        )

    def xla(a, b):
        a = a.T if case.transpose_a else a
        b = b.T if case.transpose_b else b
        return jnp.matmul(a, b, precision=_xla_precision(case))

    return jax.jit(ours), jax.jit(xla)


def _pallas_hopper_matmul():
    """JAX's own Hopper matmul (Pallas Mosaic GPU): the first of a few good tile configs
    that fits in shared memory, compiled for the first inputs it sees."""
    import inspect

    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    takes_c = "c" in inspect.signature(hm.matmul).parameters
    configs = [
        dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4, grid_tile_width=8),
        dict(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=3, grid_tile_width=8),
        dict(tile_m=128, tile_n=64, tile_k=64, max_concurrent_steps=4),
    ]
    compiled = {}

    def run(a, b):
        if "fn" not in compiled:
            errors = []
            for kw in configs:
                config = hm.TuningConfig(epi_tile_n=64, epi_tile_m=64, **kw)
                fn = jax.jit(lambda a, b, config=config: hm.matmul(a, b, None, config=config) if takes_c
                             else hm.matmul(a, b, config=config))
                try:
                    jax.block_until_ready(fn(a, b))
                except Exception as e:  # noqa: BLE001 - e.g. shared memory overflow: next config
                    errors.append(str(e)[:120])
                    continue
                compiled["fn"] = fn
                break
            else:
                raise RuntimeError(f"no Pallas config ran: {errors}")
        return compiled["fn"](a, b)

    return run


def run_case(case: Case, iterations: int, seed: int = 0) -> dict:
    args = _inputs(case, seed)
    ours, xla = _functions(case)
    ours_ms, xla_ms, method = time_pair_ms(ours, xla, args, iterations)
    first = lambda out: jax.tree_util.tree_leaves(out)[0]  # noqa: E731  (y, or the product)
    return {
        **dataclasses.asdict(case),
        "ours_ms": ours_ms,
        "xla_ms": xla_ms,
        "ours_tflops": case.flops / ours_ms / 1e9,
        "xla_tflops": case.flops / xla_ms / 1e9,
        "xla_over_ours": xla_ms / ours_ms,
        "baseline": case.baseline,
        "rel_err_vs_xla": rel_error(first(ours(*args)), first(xla(*args))) if case.kind != "fused" else float("nan"),
        "timer": method,
    }


def format_table(rows: list[dict]) -> str:
    header = (
        f"{'case':<26} {'M x N x K':>17} {'baseline':>13} {'ours ms':>9} {'base ms':>9} {'ours TF/s':>9} "
        f"{'base TF/s':>9} {'base/ours':>9} {'rel err':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        shape = f"{r['m']}x{r['n']}x{r['k']}"
        lines.append(
            f"{r['name']:<26} {shape:>17} {r['baseline']:>13} {r['ours_ms']:>9.3f} {r['xla_ms']:>9.3f} "
            f"{r['ours_tflops']:>9.1f} {r['xla_tflops']:>9.1f} {r['xla_over_ours']:>9.3f} {r['rel_err_vs_xla']:>8.1e}"
        )
    if rows:
        ratios = [r["xla_over_ours"] for r in rows]
        geo = float(np.exp(np.mean(np.log(ratios))))
        lines.append(f"geometric mean base/ours: {geo:.3f} (timer: {rows[0]['timer']}, device: {jax.devices()[0].device_kind})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxgemm.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default=None,
                        help=f"comma-separated, of: {', '.join(sorted(SUITES))} (default: simt on a GPU, smoke elsewhere)")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--plot", help="draw each suite's rates and ratios into this PNG (needs matplotlib)")
    parser.add_argument("--only", help="comma-separated substrings: run only cases whose name contains one")
    args = parser.parse_args(argv)
    if jax.default_backend() != "gpu":
        print(f"no GPU (JAX backend: {jax.default_backend()}): jaxgemm lowers to XLA's own ops here, so the ratios "
              "measure only the lowering; wall-clock timer", file=sys.stderr)
        if args.suite is None:
            print("--suite smoke (the GPU suites take minutes on a CPU; name them to run them anyway)", file=sys.stderr)
    names = (args.suite or ("simt" if jax.default_backend() == "gpu" else "smoke")).split(",")
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {unknown}; choose from {sorted(SUITES)}")
    cases = [(n, case) for n in names for case in SUITES[n]()]
    if args.only:
        cases = [(n, c) for n, c in cases if any(part in c.name for part in args.only.split(","))]
        if not cases:
            parser.error(f"--only {args.only!r} matches no case of suite(s) {names}")
    rows, by_suite = [], {n: [] for n in names}
    for i, (suite, case) in enumerate(cases):
        print(f"\r[{i + 1}/{len(cases)}] {case.name:<30}", end="", file=sys.stderr, flush=True)
        try:
            rows.append(run_case(case, args.iterations))
            by_suite[suite].append(rows[-1])
        except Exception as e:  # noqa: BLE001 - one failing baseline must not lose the table
            print(f"\n{case.name}: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
    print(file=sys.stderr)
    if args.plot and rows:
        from jaxgemm.bench.plot import plot

        plot(by_suite, args.plot, f"jaxgemm vs XLA on {jax.devices()[0].device_kind} ({rows[0]['timer']} timer)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
