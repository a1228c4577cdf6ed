"""jaxgemm's fp8 path against XLA on the same inputs: scaled_matmul's products, or with
--dense the fp8 training layer's forward + backward.

Products (default), e4m3 operands with one scale per row; for each shape (M, N, K), kernel
time (CUPTI medians, alternating rounds, one process):
  ours        jaxgemm.scaled_matmul(lhs (1, M, K), rhs (1, N, K), row scales), bfloat16
              result (the kernel, the scales in its epilogue);
  kernel      jaxgemm's fp8 GEMM alone, unscaled, bfloat16 result;
  xla_fp8     XLA's dot of the e4m3 operands into float32 (cuBLASLt's fp8 GEMM), times the
              row scales, bfloat16 result: what a user writes in jnp for the same result;
  cublas_fp8  XLA's fp8 GEMM alone, unscaled, bfloat16 result (the converts into its dot
              become cuBLASLt's fp8 GEMM): what `kernel` is to match;
  jax_nn      jax.nn.scaled_matmul on the same arguments (what XLA runs for it here);
  xla_bf16    XLA's bfloat16 GEMM of the same shape on bfloat16 copies (the rate fp8 doubles).
Also the relative Frobenius error of ours and xla_fp8 with float32 results (the sums'
error, not bfloat16's rounding) from XLA's float32 dot of the dequantized operands at
HIGHEST precision, and the custom calls of XLA's fp8 dot.

--blocks: e4m3 operands with 1 x 128 block scales on both (DeepSeek-V3's activations):
  ours        jaxgemm.scaled_matmul, bfloat16 result (the block-scaled kernel);
  tiles       the same with rhs in 128 x 128 tiles (DeepSeek-V3's weights: each tile's
              scale repeated over its rows, and rhs_tiles=True, as fp8.dense calls it: the
              kernel's promotion then takes one scale per 64 columns; on a GPU, for now,
              only under JAXGEMM_BLOCK_SCALE_GROUPS=1, else the per-row scales' kernel);
  jax_nn      jax.nn.scaled_matmul on the same arguments (dequantized, then a dot: what XLA
              runs on Hopper);
  rowwise     jaxgemm.scaled_matmul with one scale per row (the fp8 GEMM with fast
              accumulation, then the scales): the fp8 rate without promotion;
  xla_bf16    XLA's bfloat16 GEMM of the same shape;
and the errors of ours and tiles with a float32 result from the float64 definition.

--dense: a layer of M tokens, K -> N features, bf16, bias + gelu, forward and backward (the
vjp of all three inputs): jaxgemm.fp8.dense rowwise ("fp8"), blockwise ("fp8_block") and
delayed ("fp8_delayed": its history from a step on the same inputs, its vjp the new
history too) against jaxgemm.dense and jnp's bf16 layer, and the rowwise and delayed
layers' output and gradients against jnp's (the e4m3 rounding, ~4e-2); --grad-format e5m2
runs every fp8 layer's dz in e5m2.
    python3 -P tools/bench_fp8.py [--shapes 8192x8192x8192,...] [--iterations 10]
        [--blocks | --dense [--grad-format e5m2]]
"""

import argparse
import re

import jax
import jax.numpy as jnp
import numpy as np

import jaxgemm
from jaxgemm.bench import time_alternating_ms
from jaxgemm.gemm import GemmConfig, call_gemm_ffi, gemm_workspace_bytes
from jaxgemm.scaled import scaled_matmul_tiled

SHAPES = "8192x8192x8192,4096x4096x4096,8192x8192x2048,5000x7000x3008,512x8192x8192"


def operands(m, n, k, seed=0, blocks=1):
    keys = jax.random.split(jax.random.key(seed), 4)
    lhs = jax.random.uniform(keys[0], (1, m, k), jnp.float32, -4, 4).astype(jnp.float8_e4m3fn)
    rhs = jax.random.uniform(keys[1], (1, n, k), jnp.float32, -4, 4).astype(jnp.float8_e4m3fn)
    lhs_scales = jax.random.uniform(keys[2], (1, m, blocks), jnp.float32, 0.25, 2)
    rhs_scales = jax.random.uniform(keys[3], (1, n, blocks), jnp.float32, 0.25, 2)
    return lhs, rhs, lhs_scales, rhs_scales


# Every product takes the same inputs: operands(), then bfloat16 copies of lhs and rhs.
def ours(lhs, rhs, ls, rs, *_, out_dtype=jnp.bfloat16):
    return jaxgemm.scaled_matmul(lhs, rhs, ls, rs, out_dtype)


def kernel(lhs, rhs, *_):
    config = GemmConfig(transpose_b=True, out_dtype=jnp.dtype(jnp.bfloat16), split_k=1)
    platform = jax.default_backend().replace("gpu", "cuda")
    workspace = gemm_workspace_bytes(lhs.shape, rhs.shape, lhs.dtype, config, 1, platform)
    out_shape = (lhs.shape[0], lhs.shape[1], rhs.shape[1])
    return call_gemm_ffi(lhs, rhs, config=config, out_shape=out_shape, workspace_bytes=workspace)[0]


def xla_fp8(lhs, rhs, ls, rs, *_, out_dtype=jnp.bfloat16):
    acc = jax.lax.dot_general(lhs, rhs, (((2,), (2,)), ((0,), (0,))), preferred_element_type=jnp.float32)
    return (acc * ls * jnp.swapaxes(rs, 1, 2)).astype(out_dtype)


def cublas_fp8(lhs, rhs, *_):
    return jnp.einsum("bmk,bnk->bmn", lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16))


def jax_nn(lhs, rhs, ls, rs, *_):
    return jax.nn.scaled_matmul(lhs, rhs, ls, rs, preferred_element_type=jnp.bfloat16)


def xla_bf16(lhs, rhs, ls, rs, lhs16, rhs16):
    return jnp.einsum("bmk,bnk->bmn", lhs16, rhs16)


def reference(lhs, rhs, ls, rs, *_):
    a, b = lhs.astype(jnp.float32) * ls, rhs.astype(jnp.float32) * rs
    return jnp.einsum("bmk,bnk->bmn", a, b, precision=jax.lax.Precision.HIGHEST)


def rel_error(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def lowers(fn, inputs) -> bool:
    """False where JAX has no lowering for it on this platform (jax.nn's on a CPU before 0.11)."""
    try:
        fn.lower(*inputs)
        return True
    except NotImplementedError:
        return False


def bench_products(shapes, iterations):
    fns = {"ours": ours, "kernel": kernel, "xla_fp8": xla_fp8, "cublas_fp8": cublas_fp8, "jax_nn": jax_nn,
           "xla_bf16": xla_bf16}  # fmt: skip
    print(f"{'shape':>20} " + " ".join(f"{n + ' ms':>13}" for n in fns)
          + "  xla_fp8/ours  cublas/kernel  bf16/ours  ours TFLOPS  err ours  err xla_fp8  xla_fp8 call")
    for m, n, k in shapes:
        inputs = operands(m, n, k)
        inputs += (inputs[0].astype(jnp.bfloat16), inputs[1].astype(jnp.bfloat16))
        jitted = {name: jax.jit(fn) for name, fn in fns.items() if lowers(jax.jit(fn), inputs)}
        # (Two rounds, the order reversed in the second: with four a shape took ~100 s on an
        # H200, not yet profiled; compiles inside each CUPTI measure are the suspect.)
        ms, method = time_alternating_ms(jitted, inputs, iterations, rounds=2)
        ref = jax.jit(reference)(*inputs)
        errors = [rel_error(jax.jit(fn, static_argnames="out_dtype")(*inputs, out_dtype=jnp.float32), ref)
                  for fn in (ours, xla_fp8)]  # fmt: skip
        hlo = jitted["xla_fp8"].lower(*inputs).compile().as_text()
        calls = sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo))) or ["none (a fusion)"]
        ms = {name: ms.get(name, float("nan")) for name in fns}  # (nan: no lowering here)
        print(f"{m}x{n}x{k}".rjust(20) + " " + " ".join(f"{ms[name]:13.3f}" for name in fns)
              + f"  {ms['xla_fp8'] / ms['ours']:12.3f}  {ms['cublas_fp8'] / ms['kernel']:13.3f}"
              + f"  {ms['xla_bf16'] / ms['ours']:9.3f}  {2 * m * n * k / ms['ours'] / 1e9:11.0f}"
              + f"  {errors[0]:8.1e}  {errors[1]:11.1e}  {','.join(calls)}  ({method})")


def reference64(lhs, rhs, ls, rs):
    """The block-scaled definition in float64 on the host."""
    def dequantized(x, s):
        x, s = np.asarray(x.astype(jnp.float32), np.float64), np.asarray(s, np.float64)
        return x * np.repeat(s, x.shape[-1] // s.shape[-1], axis=-1)

    return np.einsum("bmk,bnk->bmn", dequantized(lhs, ls), dequantized(rhs, rs))


def tiles(lhs, rhs, ls, rs, rl, rr, rt, *_, out_dtype=jnp.bfloat16):
    return scaled_matmul_tiled(lhs, rhs, ls, rt, out_dtype, rhs_tiles=True)


def bench_blocks(shapes, iterations):
    # Inputs: lhs, rhs, their block scales, their row scales, rhs's tile scales, bf16 copies.
    fns = {"ours": ours, "tiles": tiles, "jax_nn": jax_nn,
           "rowwise": lambda lhs, rhs, ls, rs, rl, rr, *_: ours(lhs, rhs, rl, rr),
           "xla_bf16": lambda lhs, rhs, ls, rs, rl, rr, rt, lhs16, rhs16: xla_bf16(lhs, rhs, ls, rs, lhs16, rhs16)}
    print(f"{'shape':>20} " + " ".join(f"{n + ' ms':>12}" for n in fns)
          + "  jax_nn/ours  rowwise/ours  rowwise/tiles  bf16/ours  ours TFLOPS  tiles TFLOPS  err ours  err tiles")
    for m, n, k in shapes:
        inputs = operands(m, n, k, blocks=k // 128)
        rows = operands(m, n, k)[2:]
        tiled = jnp.repeat(inputs[3][:, ::128], 128, axis=1)[:, :n]
        inputs += rows + (tiled, inputs[0].astype(jnp.bfloat16), inputs[1].astype(jnp.bfloat16))
        jitted = {name: jax.jit(fn) for name, fn in fns.items() if lowers(jax.jit(fn), inputs)}
        ms, method = time_alternating_ms(jitted, inputs, iterations, rounds=2)
        ms = {name: ms.get(name, float("nan")) for name in fns}
        errors = [float("nan")] * 2
        if m * n * k <= 4096**3:  # (the float64 reference on the host)
            for i, (fn, rs) in enumerate(((ours, inputs[3]), (tiles, tiled))):
                out = jax.jit(fn, static_argnames="out_dtype")(*inputs, out_dtype=jnp.float32)
                errors[i] = rel_error(out, reference64(inputs[0], inputs[1], inputs[2], rs))
        tflops = {name: 2 * m * n * k / ms[name] / 1e9 for name in ("ours", "tiles")}
        print(f"{m}x{n}x{k}".rjust(20) + " " + " ".join(f"{ms[name]:12.3f}" for name in fns)
              + f"  {ms['jax_nn'] / ms['ours']:11.3f}  {ms['rowwise'] / ms['ours']:12.3f}"
              + f"  {ms['rowwise'] / ms['tiles']:13.3f}  {ms['xla_bf16'] / ms['ours']:9.3f}"
              + f"  {tflops['ours']:11.0f}  {tflops['tiles']:12.0f}  {errors[0]:8.1e}  {errors[1]:9.1e}  ({method})")


def layer_inputs(m, n, k, seed=0):
    keys = jax.random.split(jax.random.key(seed), 4)
    x = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
    bias = (0.1 * jax.random.normal(keys[2], (n,), jnp.float32)).astype(jnp.bfloat16)
    ct = jax.random.normal(keys[3], (m, n), jnp.bfloat16)
    return x, w, bias, ct


def fwd_bwd(layer):
    def run(x, w, bias, ct):
        y, vjp = jax.vjp(layer, x, w, bias)
        return y, vjp(ct)

    return run


def delayed_layer(grad_format, x, w, bias, ct):
    """fp8.dense(scaling="delayed") as a layer of (x, w, bias) whose vjp also returns the
    new history (as a training step computes it), from the history one step on these
    inputs leaves (each tensor's own amax)."""
    def layer(x, w, b, h):
        return jaxgemm.fp8.dense(x, w, b, "gelu", scaling="delayed", history=h, grad_format=grad_format)

    history = jax.jit(lambda *a: jax.vjp(layer, *a)[1](ct)[3])(x, w, bias, jaxgemm.fp8.amax_history())

    def run(x, w, bias, ct):
        y, vjp = jax.vjp(layer, x, w, bias, history)
        grads = vjp(ct)
        return y, grads[:3], grads[3]

    return run


def bench_dense(shapes, iterations, grad_format="e4m3"):
    layers = {
        "fp8": lambda x, w, b: jaxgemm.fp8.dense(x, w, b, "gelu", grad_format=grad_format),
        "fp8_block": lambda x, w, b: jaxgemm.fp8.dense(x, w, b, "gelu", scaling="blockwise", grad_format=grad_format),
        "fp8_delayed": None,
        "jaxgemm": lambda x, w, b: jaxgemm.dense(x, w, b, "gelu"),
        "xla": lambda x, w, b: jax.nn.gelu(x @ w + b),
    }
    print(f"{'tokens x out x in':>20} " + " ".join(f"{n + ' ms':>12}" for n in layers)
          + "  jaxgemm/fp8 /fp8_block /fp8_delayed  err fp8: y dx dw db, delayed: y dx dw db")
    for m, n, k in shapes:
        inputs = layer_inputs(m, n, k)
        jitted = {name: jax.jit(fwd_bwd(layer) if layer else delayed_layer(grad_format, *inputs))
                  for name, layer in layers.items()}  # fmt: skip
        ms, method = time_alternating_ms(jitted, inputs, iterations, rounds=2)
        theirs = jitted["xla"](*inputs)
        errors = ""
        for name in ("fp8", "fp8_delayed"):
            ours = jitted[name](*inputs)
            errors += " " + " ".join(f"{rel_error(a.astype(jnp.float32), b.astype(jnp.float32)):7.1e}"
                                     for a, b in zip([ours[0], *ours[1]], [theirs[0], *theirs[1]]))  # fmt: skip
        print(f"{m}x{n}x{k}".rjust(20) + " " + " ".join(f"{ms[name]:12.3f}" for name in layers)
              + "  " + "".join(f"{ms['jaxgemm'] / ms[name]:11.3f}" for name in ("fp8", "fp8_block", "fp8_delayed"))
              + f"  {errors}  ({method})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=SHAPES, help="MxNxK, comma-separated (--dense: tokens x out x in)")
    parser.add_argument("--iterations", type=int, default=10, help="calls per round and function")
    parser.add_argument("--dense", action="store_true", help="the fp8 layer's forward + backward instead")
    parser.add_argument("--blocks", action="store_true", help="products with 1 x 128 block scales instead")
    parser.add_argument("--grad-format", choices=("e4m3", "e5m2"), default="e4m3",
                        help="--dense: the fp8 layers' dz format (e5m2: the HYBRID recipe)")
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}")
    if args.dense:
        bench_dense(shapes, args.iterations, args.grad_format)
    else:
        (bench_blocks if args.blocks else bench_products)(shapes, args.iterations)


if __name__ == "__main__":
    main()
