"""Where fp8.dense's forward + backward spends its time, kernel by kernel (CUPTI, median of
the iterations), against jaxgemm.dense's bf16 layer: every kernel of the step in launch
order, then the sums of the GEMMs, of jaxgemm's quantization passes and of everything else
(XLA's fusions: scales, transposes, element-wise work, and bias_act_grad).
    python3 -P tools/fp8_breakdown.py [--shapes 16384x14336x4096,...] [--scaling rowwise,blockwise,delayed]
A shape is tokens x out features x in features; bf16 x, w, bias, gelu."""

import argparse
import os
import sys

import jax

import jaxgemm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (python -P leaves it out)
from bench_fp8 import delayed_layer, fwd_bwd, layer_inputs  # noqa: E402 (this folder's: the same layer and inputs)
from kernel_breakdown import breakdown  # noqa: E402

SHAPES = "16384x14336x4096,32768x1024x4096,32768x4096x1024,8192x8192x8192"


def kind(name: str) -> str:
    """GEMM (jaxgemm's GEMM kernels, cuBLAS's), quantize (jaxgemm's fp8 passes) or other
    (XLA's fusions, bias_act_grad). ("jaxgemm" in a mangled name says nothing.)"""
    plain = name.lower().replace("jaxgemm", "")
    if "GemmKernel" in name or ("gemm" in plain and "fusion" not in plain):
        return "GEMM"
    return "quantize" if "Fp8" in name and "Quantize" in name or "Fp8AmaxKernel" in name else "other"


def show(label, rows):
    sums = {k: sum(ms for name, ms in rows if kind(name) == k) for k in ("GEMM", "quantize", "other")}
    print(f"  {label}: {sum(sums.values()):.3f} ms = " + " + ".join(f"{k} {v:.3f}" for k, v in sums.items())
          + f" ({len(rows)} kernels)")
    for name, ms in rows:
        print(f"    {ms:8.3f}  {kind(name):9s}{name[:90]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--scaling", default="rowwise,blockwise")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}")
    for shape in args.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        inputs = layer_inputs(m, n, k)
        print(f"{m} tokens x {n} out x {k} in, bf16, bias + gelu, forward + backward")
        show("bf16 jaxgemm.dense", breakdown(fwd_bwd(lambda x, w, b: jaxgemm.dense(x, w, b, "gelu")), inputs, 20))
        for scaling in args.scaling.split(","):
            layer = lambda x, w, b, s=scaling: jaxgemm.fp8.dense(x, w, b, "gelu", scaling=s)
            step = delayed_layer(*inputs) if scaling == "delayed" else fwd_bwd(layer)
            show(f"fp8.dense {scaling}", breakdown(step, inputs, 20))


if __name__ == "__main__":
    main()
