"""Benchmark: jaxgemm.ragged_dot against XLA's jax.lax.ragged_dot on mixture-of-experts
shapes, and against jaxgemm's dense GEMM of the same FLOPs, in one process.

    python -m jaxgemm.bench_ragged [--cases mixtral,fine64,fine128] [--iterations 6] [--json out.json]

Each case runs with balanced routing (equal groups), skewed routing (Zipf-like sizes) and,
where named, an empty group. Forward alone, and forward + backward (gradients of the
tokens and of the expert weights), bfloat16. Times come from jaxgemm.bench's alternating
CUPTI rounds on a GPU. "xla/ours" > 1: jaxgemm is faster; "of dense": jaxgemm's TFLOP/s
over its dense GEMM's at the same total work. Where XLA fails (it materializes a masked
copy of the tokens per expert and runs out of memory), its column says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxgemm
from jaxgemm.bench import time_alternating_ms


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    groups: int
    rows: int  # tokens x top-k
    k: int
    n: int


CASES = {
    "mixtral": Case("mixtral", 8, 16384 * 2, 4096, 14336),  # 16384 tokens, top-2
    "fine64": Case("fine64", 64, 32768 * 8, 2048, 1408),  # 32768 tokens, top-8
    "fine128": Case("fine128", 128, 32768 * 8, 2048, 768),
}


def group_sizes(rows: int, groups: int, routing: str) -> np.ndarray:
    """Sizes summing to `rows`: equal ("balanced"), or proportional to 1 / rank^1.2 with the
    ranks shuffled ("skewed"); "empty": balanced over all groups but the second."""
    if routing == "balanced":
        weights = np.ones(groups)
    elif routing == "empty":
        weights = np.ones(groups)
        weights[1] = 0
    else:
        weights = np.random.default_rng(0).permutation(1.0 / np.arange(1, groups + 1) ** 1.2)
    sizes = np.floor(rows * weights / weights.sum()).astype(np.int32)
    sizes[np.argmax(weights)] += rows - sizes.sum()
    return sizes


def _fwd_bwd(dot):
    def run(x, w, sizes, ct):
        out, vjp = jax.vjp(lambda x, w: dot(x, w, sizes), x, w)
        return out, *vjp(ct)

    return run


def _dense_fwd_bwd(x, w, ct):
    out, vjp = jax.vjp(jaxgemm.matmul, x, w)
    return out, *vjp(ct)


def run_case(case: Case, routing: str, iterations: int) -> dict:
    keys = jax.random.split(jax.random.key(0), 4)
    dtype = jnp.bfloat16
    x = jax.random.normal(keys[0], (case.rows, case.k), dtype)
    w = (jax.random.normal(keys[1], (case.groups, case.k, case.n), jnp.float32) / np.sqrt(case.k)).astype(dtype)
    ct = jax.random.normal(keys[2], (case.rows, case.n), dtype)
    sizes = jnp.asarray(group_sizes(case.rows, case.groups, routing))
    flops = 2.0 * case.rows * case.k * case.n
    row = {"case": case.name, "routing": routing, "groups": case.groups, "rows": case.rows, "k": case.k, "n": case.n}
    for label, ours, xla, dense, args, dense_args, work in (
        ("fwd", jax.jit(jaxgemm.ragged_dot), jax.jit(lax.ragged_dot), jax.jit(jaxgemm.matmul),
         (x, w, sizes), (x, w[0]), flops),
        ("fwd_bwd", jax.jit(_fwd_bwd(jaxgemm.ragged_dot)), jax.jit(_fwd_bwd(lax.ragged_dot)), jax.jit(_dense_fwd_bwd),
         (x, w, sizes, ct), (x, w[0], ct), 3 * flops),
    ):  # fmt: skip
        ms, _ = time_alternating_ms({"ours": ours}, args, iterations, rounds=2)
        dense_ms, _ = time_alternating_ms({"dense": dense}, dense_args, iterations, rounds=2)
        try:
            xla_ms, _ = time_alternating_ms({"xla": xla}, args, max(1, iterations // 2), rounds=2)
            xla_ms = xla_ms["xla"]
        except Exception as e:  # noqa: BLE001 - XLA's failure (out of memory) is a result
            print(f"  XLA {case.name} {routing} {label} failed: {str(e).splitlines()[0][:160]}", file=sys.stderr)
            xla_ms = float("nan")
        row[f"{label}_ms"], row[f"{label}_xla_ms"], row[f"{label}_dense_ms"] = ms["ours"], xla_ms, dense_ms["dense"]
        row[f"{label}_tflops"] = work / ms["ours"] / 1e9
        row[f"{label}_of_dense"] = dense_ms["dense"] / ms["ours"]
        row[f"{label}_xla_over_ours"] = xla_ms / ms["ours"]
    return row


def format_table(rows: list[dict]) -> str:
    head = (f"{'case':8} {'routing':9} {'fwd ms':>8} {'TFLOP/s':>8} {'xla/ours':>9} {'of dense':>9}"
            f" {'f+b ms':>8} {'TFLOP/s':>8} {'xla/ours':>9} {'of dense':>9}")  # fmt: skip
    lines = [head]
    for r in rows:
        cells = [f"{r['case']:8} {r['routing']:9}"]
        for label in ("fwd", "fwd_bwd"):
            ratio = r[f"{label}_xla_over_ours"]
            cells.append(f"{r[f'{label}_ms']:8.2f} {r[f'{label}_tflops']:8.0f} "
                         f"{'fails' if np.isnan(ratio) else f'{ratio:.2f}x':>9} {r[f'{label}_of_dense']:9.2f}")  # fmt: skip
        lines.append(" ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="mixtral,fine64,fine128", help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--routings", default="balanced,skewed,empty")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    if jax.default_backend() != "gpu":
        print("bench_ragged: no GPU; these shapes take minutes per case on a CPU", file=sys.stderr)
        return 1
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {', '.join(CASES)}")
    rows = []
    for name in args.cases.split(","):
        for routing in args.routings.split(","):
            print(f"{name} {routing} ...", file=sys.stderr, flush=True)
            rows.append(run_case(CASES[name], routing, args.iterations))
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
