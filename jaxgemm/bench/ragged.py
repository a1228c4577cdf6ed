"""Benchmark: jaxgemm.ragged_dot against XLA's jax.lax.ragged_dot on mixture-of-experts
shapes, and against jaxgemm's dense GEMM of the same FLOPs, in one process.

    python -m jaxgemm.bench.ragged [--cases mixtral,fine64,fine128] [--iterations 6] [--json out.json] [--breakdown]
                                   [--no-xla] [--plot out.png] [--from rows.json,...]

Each case runs with balanced routing (equal groups), skewed routing (Zipf-like sizes) and,
where named, an empty group. Forward alone, and forward + backward (gradients of the
tokens and of the expert weights), bfloat16. Times come from jaxgemm.bench's alternating
CUPTI rounds on a GPU. "xla/ours" > 1: jaxgemm is faster; "of dense": jaxgemm's TFLOP/s
over its dense GEMM's at the same total work; "padded/ours": XLA's padded formulation
(each expert's rows scattered into a buffer of the largest group's size, one batched
matmul, the rows gathered back). Where XLA fails (its ragged dot materializes a masked copy
of the tokens per expert; the padded buffer of skewed routing), the column says so.
`--no-xla` times only jaxgemm and its dense GEMM (A/B runs: XLA's ragged dot takes up to
150 ms a call). `--cases tiny` runs anywhere (a check of the script, not a measurement).
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
from jaxgemm.bench import rel_error, time_alternating_ms
from jaxgemm.ragged import epilogue_in_jax


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
    "tiny": Case("tiny", 8, 512, 64, 128),
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


def _grad_only(dot, argnum):
    """The gradient of one operand alone (jit drops the forward product and the other one)."""

    def run(x, w, sizes, ct):
        _, vjp = jax.vjp(lambda x, w: dot(x, w, sizes), x, w)
        return vjp(ct)[argnum]

    return run


def _padded(sizes: np.ndarray, rows: int):
    """The padded formulation of a ragged product with these (concrete) group sizes."""
    groups, capacity = len(sizes), -(-max(int(sizes.max()), 1) // 128) * 128
    group = np.repeat(np.arange(groups), sizes)
    position = np.arange(rows) - np.repeat(np.cumsum(sizes) - sizes, sizes)

    def dot(x, w, _sizes):
        buffer = jnp.zeros((groups, capacity, x.shape[1]), x.dtype).at[group, position].set(x)
        y = jnp.einsum("gck,gkn->gcn", buffer, w, preferred_element_type=jnp.float32).astype(x.dtype)
        return y[group, position]

    return dot


def _timed(name, fn, args, iterations, what) -> float:
    """Median ms of fn, or NaN (said on stderr) where it fails: a baseline's failure is a result."""
    try:
        return time_alternating_ms({name: fn}, args, iterations, rounds=2)[0][name]
    except Exception as e:  # noqa: BLE001
        print(f"  {name} {what} failed: {str(e).splitlines()[0][:160]}", file=sys.stderr)
        return float("nan")


def _dense_fwd_bwd(x, w, ct):
    out, vjp = jax.vjp(jaxgemm.matmul, x, w)
    return out, *vjp(ct)


def _unfused_epilogue(activation):
    """The product, then bias[group] + activation as XLA's elementwise pass (what
    ragged_dot's epilogue replaces where the grouped kernel takes it)."""

    def dot(x, w, sizes, bias):
        z = jaxgemm.ragged_dot(x, w, sizes)
        return epilogue_in_jax(z, sizes, bias, activation, None, want_aux=False)[0]

    return dot


def epilogue_times(case: Case, routing: str, activation: str, iterations: int) -> dict:
    """Forward ms with bias + activation: fused into the grouped kernel, and the product then
    XLA's elementwise pass; the plain product beside them."""
    keys = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(keys[0], (case.rows, case.k), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (case.groups, case.k, case.n), jnp.float32) / np.sqrt(case.k)).astype(x.dtype)
    bias = jax.random.normal(keys[2], (case.groups, case.n), jnp.float32)
    sizes = jnp.asarray(group_sizes(case.rows, case.groups, routing))
    fused = lambda x, w, s, b: jaxgemm.ragged_dot(x, w, s, bias=b, activation=activation)  # noqa: E731
    plain = lambda x, w, s, b: jaxgemm.ragged_dot(x, w, s)  # noqa: E731
    fns = {"fused": fused, "unfused": _unfused_epilogue(activation), "plain": plain}
    times = time_alternating_ms({k: jax.jit(f) for k, f in fns.items()}, (x, w, sizes, bias), iterations, rounds=2)[0]
    error = rel_error(jax.jit(fused)(x, w, sizes, bias), jax.jit(fns["unfused"])(x, w, sizes, bias))
    return {"case": case.name, "routing": routing, **{f"{k}_ms": v for k, v in times.items()}, "rel_err": error}


def glu_times(case: Case, routing: str, iterations: int) -> dict:
    """Forward ms of a SwiGLU expert layer's first half: ragged_glu (one grouped kernel for
    both weights) against silu(ragged_dot(x, w_gate)) * ragged_dot(x, w_up) (two products,
    then XLA's elementwise pass)."""
    keys = jax.random.split(jax.random.key(2), 3)
    x = jax.random.normal(keys[0], (case.rows, case.k), jnp.bfloat16)
    w_gate, w_up = ((jax.random.normal(key, (case.groups, case.k, case.n), jnp.float32) / np.sqrt(case.k))
                    .astype(x.dtype) for key in keys[1:])  # fmt: skip
    sizes = jnp.asarray(group_sizes(case.rows, case.groups, routing))
    fns = {
        "fused": lambda x, wg, wu, s: jaxgemm.ragged_glu(x, wg, wu, s),
        "unfused": lambda x, wg, wu, s: (jax.nn.silu(jaxgemm.ragged_dot(x, wg, s).astype(jnp.float32))
                                         * jaxgemm.ragged_dot(x, wu, s)).astype(x.dtype),
    }  # fmt: skip
    times = time_alternating_ms({k: jax.jit(f) for k, f in fns.items()}, (x, w_gate, w_up, sizes), iterations,
                                rounds=2)[0]  # fmt: skip
    error = rel_error(*(jax.jit(f)(x, w_gate, w_up, sizes) for f in fns.values()))
    flops = 4.0 * case.rows * case.k * case.n
    return {"case": case.name, "routing": routing, **{f"{k}_ms": v for k, v in times.items()},
            "tflops": flops / times["fused"] / 1e9, "rel_err": error}  # fmt: skip


def run_case(case: Case, routing: str, iterations: int, breakdown: bool = False, xla: bool = True) -> dict:
    keys = jax.random.split(jax.random.key(0), 4)
    dtype = jnp.bfloat16
    x = jax.random.normal(keys[0], (case.rows, case.k), dtype)
    w = (jax.random.normal(keys[1], (case.groups, case.k, case.n), jnp.float32) / np.sqrt(case.k)).astype(dtype)
    ct = jax.random.normal(keys[2], (case.rows, case.n), dtype)
    sizes_np = group_sizes(case.rows, case.groups, routing)
    sizes, padded = jnp.asarray(sizes_np), _padded(sizes_np, case.rows)
    flops = 2.0 * case.rows * case.k * case.n
    row = {"case": case.name, "routing": routing, "groups": case.groups, "rows": case.rows, "k": case.k, "n": case.n}
    for label, wrap, args, dense, dense_args, work in (
        ("fwd", lambda dot: dot, (x, w, sizes), jaxgemm.matmul, (x, w[0]), flops),
        ("fwd_bwd", _fwd_bwd, (x, w, sizes, ct), _dense_fwd_bwd, (x, w[0], ct), 3 * flops),
    ):  # fmt: skip
        what = f"{case.name} {routing} {label}"
        ms = _timed("ours", jax.jit(wrap(jaxgemm.ragged_dot)), args, iterations, what)
        row[f"{label}_ms"] = ms
        row[f"{label}_dense_ms"] = _timed("dense", jax.jit(dense), dense_args, iterations, what)
        row[f"{label}_tflops"] = work / ms / 1e9
        row[f"{label}_of_dense"] = row[f"{label}_dense_ms"] / ms
        if xla:
            row[f"{label}_xla_ms"] = _timed("xla", jax.jit(wrap(lax.ragged_dot)), args, max(1, iterations // 2), what)
            row[f"{label}_padded_ms"] = _timed("padded", jax.jit(wrap(padded)), args, max(1, iterations // 2), what)
            row[f"{label}_xla_over_ours"] = row[f"{label}_xla_ms"] / ms
            row[f"{label}_padded_over_ours"] = row[f"{label}_padded_ms"] / ms
    if breakdown:  # each gradient alone, against the dense GEMM's same gradient
        dense = lambda x, w, _sizes: jaxgemm.matmul(x, w[0])  # noqa: E731
        for label, argnum in (("dlhs", 0), ("drhs", 1)):
            what = f"{case.name} {routing} {label}"
            ms = _timed("ours", jax.jit(_grad_only(jaxgemm.ragged_dot, argnum)), (x, w, sizes, ct), iterations, what)
            dense_ms = _timed("dense", jax.jit(_grad_only(dense, argnum)), (x, w, sizes, ct), iterations, what)
            row[f"{label}_ms"], row[f"{label}_of_dense"] = ms, dense_ms / ms
    try:  # the same answer (bf16 outputs of the same products)
        row["rel_err_vs_padded"] = rel_error(jax.jit(jaxgemm.ragged_dot)(x, w, sizes), jax.jit(padded)(x, w, sizes))
    except Exception:  # noqa: BLE001 - where the padded buffer does not fit
        row["rel_err_vs_padded"] = float("nan")
    return row


def format_table(rows: list[dict]) -> str:
    def ratio(x):  # None: not measured (rows of an older --json)
        return "-" if x is None else "fails" if np.isnan(x) else f"{x:.2f}x"

    part = f"{'ms':>8} {'TFLOP/s':>8} {'xla/ours':>9} {'padded/ours':>11} {'of dense':>9}"
    lines = [f"{'':18} {'forward':^49} {'forward + backward':^49}", f"{'case':8} {'routing':9} {part} {part}"]
    for r in rows:
        cells = [f"{r['case']:8} {r['routing']:9}"]
        for label in ("fwd", "fwd_bwd"):
            cells.append(f"{r[f'{label}_ms']:8.2f} {r[f'{label}_tflops']:8.0f} {ratio(r.get(f'{label}_xla_over_ours')):>9} "
                         f"{ratio(r.get(f'{label}_padded_over_ours')):>11} {r[f'{label}_of_dense']:9.2f}")  # fmt: skip
        error = r.get("rel_err_vs_padded")
        lines.append(" ".join(cells) + ("" if error is None else f"  (error vs padded {error:.1e})"))
    return "\n".join(lines)


def plot_rows(rows: list[dict], path: str, title: str) -> None:
    """TFLOP/s per (case, routing): jaxgemm, its dense GEMM at the same work, XLA's ragged dot
    ("fails" where it did), forward and forward + backward side by side. Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 1.2 + 0.55 * len(rows)), sharey=True)
    labels = [f"{r['case']} {r['routing']}\n{r['groups']} experts, {r['rows']} rows, {r['k']} -> {r['n']}" for r in rows]
    ys = np.arange(len(rows))
    for ax, (label, work, title_part) in zip(axes, (("fwd", 1, "forward"), ("fwd_bwd", 3, "forward + backward"))):
        flops = [work * 2.0 * r["rows"] * r["k"] * r["n"] for r in rows]
        bars = {
            "jaxgemm.ragged_dot": [f / r[f"{label}_ms"] / 1e9 for f, r in zip(flops, rows)],
            "jaxgemm dense GEMM, same work": [f / r[f"{label}_dense_ms"] / 1e9 for f, r in zip(flops, rows)],
            "XLA ragged_dot": [f / r.get(f"{label}_xla_ms", np.nan) / 1e9 for f, r in zip(flops, rows)],
        }
        for i, (name, values) in enumerate(bars.items()):
            ax.barh(ys + (i - 1) * 0.27, np.nan_to_num(values), 0.27, label=name)
        for y, value, r in zip(ys, bars["XLA ragged_dot"], rows):
            if np.isnan(value):
                why = "fails (out of memory)" if f"{label}_xla_ms" in r else "not measured"
                ax.text(5, y + 0.27, f"XLA {why}", va="center", fontsize=7)
        ax.set_xlabel("TFLOP/s")
        ax.set_title(title_part)
    axes[0].set_yticks(ys, labels, fontsize=7)
    axes[0].invert_yaxis()  # (shared: once) the first row on top
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=8, loc="upper right", ncol=3)
    fig.suptitle(title, x=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxgemm.bench.ragged", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="mixtral,fine64,fine128", help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--routings", default="balanced,skewed,empty")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--plot", metavar="PNG", help="draw the rates (needs matplotlib)")
    parser.add_argument("--from", dest="from_json", metavar="JSON", help="plot / print these rows (comma-separated "
                        "files of --json) instead of measuring")  # fmt: skip
    parser.add_argument("--title", help="the plot's title (--from)")
    parser.add_argument("--no-xla", action="store_true", help="skip XLA's ragged dot and the padded formulation")
    parser.add_argument("--glu", action="store_true",
                        help="instead: ragged_glu (SwiGLU's two products in one kernel) against two ragged_dots")
    parser.add_argument("--epilogue", metavar="ACTIVATION",
                        help="instead: the forward with a bias and this activation, fused against unfused")  # fmt: skip
    parser.add_argument("--breakdown", action="store_true",
                        help="also each gradient alone (d lhs, d rhs) against the dense GEMM's")  # fmt: skip
    args = parser.parse_args(argv)
    if args.from_json:
        rows = []
        for path in args.from_json.split(","):
            with open(path) as f:
                rows += json.load(f)
        print(format_table(rows))
        if args.plot:
            plot_rows(rows, args.plot, args.title or "jaxgemm.ragged_dot, bf16")
        return 0
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {', '.join(CASES)}")
    if jax.default_backend() != "gpu" and cases != ["tiny"]:
        print("jaxgemm.bench.ragged: no GPU; these shapes take minutes per case on a CPU (--cases tiny checks the script)",
              file=sys.stderr)  # fmt: skip
        return 1
    if args.glu:
        print(f"{'case':8} {'routing':9} {'fused ms':>9} {'unfused ms':>11} {'TFLOP/s':>8} {'rel err':>8}")
        for name in cases:
            for routing in args.routings.split(","):
                r = glu_times(CASES[name], routing, args.iterations)
                print(f"{r['case']:8} {r['routing']:9} {r['fused_ms']:9.2f} {r['unfused_ms']:11.2f} "
                      f"{r['tflops']:8.0f} {r['rel_err']:8.1e}")  # fmt: skip
        return 0
    if args.epilogue:
        print(f"{'case':8} {'routing':9} {'fused ms':>9} {'unfused ms':>11} {'plain ms':>9} {'rel err':>8}")
        for name in cases:
            for routing in args.routings.split(","):
                r = epilogue_times(CASES[name], routing, args.epilogue, args.iterations)
                print(f"{r['case']:8} {r['routing']:9} {r['fused_ms']:9.2f} {r['unfused_ms']:11.2f} "
                      f"{r['plain_ms']:9.2f} {r['rel_err']:8.1e}")  # fmt: skip
        return 0
    rows = []
    for name in cases:
        for routing in args.routings.split(","):
            print(f"{name} {routing} ...", file=sys.stderr, flush=True)
            rows.append(run_case(CASES[name], routing, args.iterations, args.breakdown, xla=not args.no_xla))
    print(format_table(rows))
    if args.breakdown:
        print(f"\n{'case':8} {'routing':9} {'d lhs ms':>9} {'of dense':>9} {'d rhs ms':>9} {'of dense':>9}")
        for r in rows:
            print(f"{r['case']:8} {r['routing']:9} {r['dlhs_ms']:9.2f} {r['dlhs_of_dense']:9.2f} "
                  f"{r['drhs_ms']:9.2f} {r['drhs_of_dense']:9.2f}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.plot:
        plot_rows(rows, args.plot, f"jaxgemm.ragged_dot, bf16, {jax.devices()[0].device_kind}")
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
