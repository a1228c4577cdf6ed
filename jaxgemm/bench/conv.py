"""Benchmark: jaxgemm.conv2d vs XLA (cuDNN) on ResNet-50's layers and a few others (LAYERS), in one process.

    python -m jaxgemm.bench.conv [--dtypes bfloat16,float32] [--batch 64] [--iterations 30] [--json out.json]
                                 [--plot out.png] [--breakdown] [--from rows.json --title ...]

For every layer, the forward pass alone and forward + backward (gradients of x and w) of
`conv2d(x, w, stride, "SAME")` against `lax.conv_general_dilated` on the same inputs
(float32 at HIGHEST precision on both sides: exact fp32, no tf32). Times come from
jaxgemm.bench.time_pair_ms (CUPTI kernel time in alternating rounds on a GPU, wall-clock
otherwise); `xla/ours` > 1 means jaxgemm is faster. `--breakdown` adds each gradient
alone (dx only: dgrad; dw only: wgrad; jit drops the other one on both sides).
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
from jaxgemm.bench import rel_error, time_pair_ms


@dataclasses.dataclass(frozen=True)
class Layer:
    name: str
    hw: int  # input height = width
    c: int
    k: int
    rs: int  # filter height = width
    stride: int = 1


# ResNet-50 convolutions (input size, C -> K, filter, stride).
RESNET50 = [
    Layer("56^2 64->64 3x3", 56, 64, 64, 3),
    Layer("56^2 256->64 1x1", 56, 256, 64, 1),
    Layer("56^2 64->256 1x1", 56, 64, 256, 1),
    Layer("28^2 128->128 3x3", 28, 128, 128, 3),
    Layer("14^2 256->256 3x3", 14, 256, 256, 3),
    Layer("7^2 512->512 3x3", 7, 512, 512, 3),
    Layer("56^2 128->128 3x3 s2", 56, 128, 128, 3, 2),
    Layer("224^2 3->64 7x7 s2", 224, 3, 64, 7, 2),
]
# ResNet-50's layers; examples/train_cnn.py's four at --size gpu (time them with --batch 512),
# the first a GEMM of window columns (conv_windows.py); CIFAR's first layer; and a 16-channel
# one (the most whose data gradient runs as a GEMM + col2im).
LAYERS = RESNET50 + [
    Layer("28^2 1->128 3x3", 28, 1, 128, 3),
    Layer("28^2 128->128 3x3 s2", 28, 128, 128, 3, 2),
    Layer("14^2 128->256 3x3", 14, 128, 256, 3),
    Layer("14^2 256->256 3x3 s2", 14, 256, 256, 3, 2),
    Layer("32^2 3->64 3x3", 32, 3, 64, 3),
    Layer("56^2 16->64 3x3", 56, 16, 64, 3),
]


def _precision(dtype):
    return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def _functions(layer: Layer, dtype, kernel=None):
    """(ours_fprop, xla_fprop, ours_fwd_bwd, xla_fwd_bwd), jitted, taking (x, w, ct);
    `kernel` forces our CUDA conv kernel family (conv2d's `kernel`)."""

    def ours(x, w):
        return jaxgemm.conv2d(x, w, stride=layer.stride, padding="SAME", kernel=kernel)

    def xla(x, w):
        return lax.conv_general_dilated(
            x, w, (layer.stride,) * 2, "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=_precision(dtype)
        )

    def fwd_bwd(f):
        def run(x, w, ct):
            y, vjp = jax.vjp(f, x, w)
            return y, vjp(ct)

        return jax.jit(run)

    fprop = lambda f: jax.jit(lambda x, w, ct: f(x, w))
    return fprop(ours), fprop(xla), fwd_bwd(ours), fwd_bwd(xla)


def _gradient_functions(layer: Layer, dtype, kernel=None):
    """{"dgrad": (ours, xla), "wgrad": (ours, xla)}: one gradient alone, taking (x, w, ct)."""
    ours_f, xla_f, _, _ = _functions(layer, dtype, kernel)
    one = lambda f, i: jax.jit(lambda x, w, ct: jax.vjp(lambda *a: f(*a, ct), x, w)[1](ct)[i])
    return {kind: (one(ours_f, i), one(xla_f, i)) for i, kind in enumerate(("dgrad", "wgrad"))}


def run_layer(layer: Layer, dtype: str, batch: int, iterations: int, seed: int = 0, kernel=None,
              breakdown: bool = False) -> dict:  # fmt: skip
    kx, kw, kc = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, (batch, layer.hw, layer.hw, layer.c), dtype)
    w = jax.random.normal(kw, (layer.rs, layer.rs, layer.c, layer.k), dtype) / float(np.sqrt(layer.rs**2 * layer.c))
    out_hw = -(-layer.hw // layer.stride)
    ct = jax.random.normal(kc, (batch, out_hw, out_hw, layer.k), dtype)
    ours_f, xla_f, ours_fb, xla_fb = _functions(layer, dtype, kernel)
    args = (x, w, ct)
    row = {**dataclasses.asdict(layer), "dtype": dtype, "batch": batch, "kernel": kernel}
    flops = 2.0 * batch * out_hw * out_hw * layer.k * layer.c * layer.rs**2
    kinds = [("fprop", ours_f, xla_f, 1), ("fwd_bwd", ours_fb, xla_fb, 3)]
    if breakdown:
        kinds += [(kind, ours, xla, 1) for kind, (ours, xla) in _gradient_functions(layer, dtype, kernel).items()]
    for kind, ours, xla, mult in kinds:
        ours_ms, xla_ms, method = time_pair_ms(ours, xla, args, iterations)
        got, want = jax.tree_util.tree_leaves(ours(*args)), jax.tree_util.tree_leaves(xla(*args))
        row.update({
            f"{kind}_ours_ms": ours_ms,
            f"{kind}_xla_ms": xla_ms,
            f"{kind}_xla_over_ours": xla_ms / ours_ms,
            f"{kind}_ours_tflops": mult * flops / ours_ms / 1e9,
            f"{kind}_rel_err": max(rel_error(g, r) for g, r in zip(got, want)),
            "timer": method,
            "device": jax.devices()[0].device_kind,
        })  # fmt: skip
    return row


def _geomean(values) -> float:
    return float(np.exp(np.mean(np.log(values))))


def format_table(rows: list[dict]) -> str:
    header = (
        f"{'layer':<22} {'dtype':>8} {'fprop ours':>10} {'XLA':>8} {'XLA/ours':>8} {'TF/s':>6} "
        f"{'f+b ours':>9} {'XLA':>8} {'XLA/ours':>8} {'TF/s':>6} {'max err':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['name']:<22} {r['dtype']:>8} {r['fprop_ours_ms']:>10.3f} {r['fprop_xla_ms']:>8.3f} "
            f"{r['fprop_xla_over_ours']:>8.3f} {r['fprop_ours_tflops']:>6.0f} {r['fwd_bwd_ours_ms']:>9.3f} "
            f"{r['fwd_bwd_xla_ms']:>8.3f} {r['fwd_bwd_xla_over_ours']:>8.3f} {r['fwd_bwd_ours_tflops']:>6.0f} "
            f"{max(r['fprop_rel_err'], r['fwd_bwd_rel_err']):>8.1e}"
        )
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        sel = [r for r in rows if r["dtype"] == dtype]
        lines.append(
            f"geometric mean XLA/ours, {dtype}: fprop {_geomean([r['fprop_xla_over_ours'] for r in sel]):.3f}, "
            f"fwd+bwd {_geomean([r['fwd_bwd_xla_over_ours'] for r in sel]):.3f}"
        )
    if rows and "dgrad_ours_ms" in rows[0]:
        lines += ["", f"{'gradients alone':<22} {'dtype':>8} {'dgrad ours':>10} {'XLA':>8} {'XLA/ours':>8} "
                      f"{'wgrad ours':>10} {'XLA':>8} {'XLA/ours':>8}"]  # fmt: skip
        for r in rows:
            lines.append(
                f"{r['name']:<22} {r['dtype']:>8} {r['dgrad_ours_ms']:>10.3f} {r['dgrad_xla_ms']:>8.3f} "
                f"{r['dgrad_xla_over_ours']:>8.3f} {r['wgrad_ours_ms']:>10.3f} {r['wgrad_xla_ms']:>8.3f} "
                f"{r['wgrad_xla_over_ours']:>8.3f}"
            )
    if rows:
        device = rows[0].get("device", jax.devices()[0].device_kind)
        lines.append(f"(ms per call, timer: {rows[0]['timer']}, device: {device})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxgemm.bench.conv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated input dtypes")
    parser.add_argument("--batch", type=int, default=None, help="images per layer (default: 64 on a GPU, 2 elsewhere)")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--layers", help="comma-separated substrings of layer names (default: all)")
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--plot", metavar="PNG", help="draw the rates and ratios (needs matplotlib)")
    parser.add_argument("--kernel", choices=["sm80", "sm90"], help="force our conv kernel family (default: heuristic)")
    parser.add_argument("--breakdown", action="store_true", help="also time dgrad alone and wgrad alone")
    parser.add_argument("--from", dest="from_json", metavar="JSON", help="print / plot these rows (a file of --json) "
                        "instead of measuring")  # fmt: skip
    parser.add_argument("--title", help="the plot's title (default: the benchmark and this process's device)")
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            rows = json.load(f)
        print(format_table(rows))
        if args.plot:
            plot_rows(rows, args.plot, args.title)
            print(f"wrote {args.plot}")
        return 0
    if jax.default_backend() != "gpu":
        print(f"no GPU (JAX backend: {jax.default_backend()}): jaxgemm lowers to XLA's own convolution here; "
              f"batch {args.batch or 2} so that the run finishes", file=sys.stderr)
    args.batch = args.batch or (64 if jax.default_backend() == "gpu" else 2)
    layers = LAYERS
    if args.layers:
        keys = args.layers.split(",")
        layers = [layer for layer in LAYERS if any(key in layer.name for key in keys)]
        if not layers:
            parser.error(f"--layers {args.layers!r} matches no layer; the layers are: "
                         + ", ".join(layer.name for layer in LAYERS))
    cases = [(layer, dtype) for dtype in args.dtypes.split(",") for layer in layers]
    rows = []
    for i, (layer, dtype) in enumerate(cases):
        print(f"\r[{i + 1}/{len(cases)}] {dtype} {layer.name:<26}", end="", file=sys.stderr, flush=True)
        rows.append(run_layer(layer, dtype, args.batch, args.iterations, kernel=args.kernel, breakdown=args.breakdown))
    print(file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(format_table(rows))
    if args.plot:
        plot_rows(rows, args.plot, args.title)
        print(f"wrote {args.plot}")
    return 0


def plot_rows(rows: list[dict], path: str, title: str | None = None) -> None:
    """jaxgemm.bench.plot's figure: one suite per (dtype, pass), the forward and forward + backward."""
    from jaxgemm.bench.plot import plot

    suites = {}
    for r in rows:
        for key, label in (("fprop", "forward"), ("fwd_bwd", "forward + backward")):
            ours, ratio = r[f"{key}_ours_tflops"], r[f"{key}_xla_over_ours"]
            suites.setdefault(f"{r['dtype']} {label}", []).append(
                {"name": r["name"], "baseline": "XLA", "ours_tflops": ours, "xla_tflops": ours / ratio,
                 "xla_over_ours": ratio})
    plot(suites, path, title or f"jaxgemm.conv2d vs XLA, ResNet-50's layers and others, {jax.devices()[0].device_kind}")


if __name__ == "__main__":
    sys.exit(main())
