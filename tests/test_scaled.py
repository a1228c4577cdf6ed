"""jaxgemm.scaled_matmul on one device, against a float64 reference and jax.nn.scaled_matmul:
fp8 and 16/32-bit operands, per-tensor, per-row and 1 x 128 block scales; the fp8 kernel
(where it runs, ragged sizes, every output dtype, e5m2 beside e4m3, the FFI's contract);
bad input; jit and vmap. Sharded: test_scaled_sharding.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from jaxgemm import _ffi, scaled, xla_cpu
from jaxgemm.scaled import runs_on_fp8_kernel

F8 = (jnp.float8_e4m3fn, jnp.float8_e5m2)


def _operands(seed, b, m, n, k, kb, dtype=jnp.float8_e4m3fn, scale_dtype=jnp.float32):
    """Random operands (values spread over fp8's range, never zero) and positive scales."""
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.uniform(-4, 4, (b, m, k)), dtype)
    rhs = jnp.asarray(rng.uniform(-4, 4, (b, n, k)), dtype)
    lhs_scales = jnp.asarray(rng.uniform(0.25, 2, (b, m, kb)), scale_dtype)
    rhs_scales = jnp.asarray(rng.uniform(0.25, 2, (b, n, kb)), scale_dtype)
    return lhs, rhs, lhs_scales, rhs_scales


def _reference(lhs, rhs, lhs_scales, rhs_scales):
    """The definition in float64, from the operands as stored."""
    def dequantized(x, s):
        x, s = np.asarray(x.astype(jnp.float32), np.float64), np.asarray(s.astype(jnp.float32), np.float64)
        return x * np.repeat(s, x.shape[-1] // s.shape[-1], axis=-1)

    return np.einsum("bmk,bnk->bmn", dequantized(lhs, lhs_scales), dequantized(rhs, rhs_scales))


# jaxgemm's fp8 kernel (e4m3, one scale per row, on a Hopper GPU) sums with the tensor
# cores' fp8 accumulation, ~14 bits kept, so its error grows with K: from float64, on an
# H200, 3.4e-4 at K = 256, 1.2e-3 at 4096 and 1.8e-3 at 8192 (cuBLASLt's fp8 GEMM 1.2e-3 and
# 1.9e-3 on the same operands; tools/bench_fp8.py). For K <= 8192:
FP8_KERNEL_BOUND = 3e-3


def _bound(args, exact=1e-6):
    """float32 rounding of the float64 definition, or the fp8 kernel's bound where any shard
    of these operands (e4m3, or e5m2 beside e4m3) may run on it (a GPU; the CPU's FFI
    reference sums in float32)."""
    return FP8_KERNEL_BOUND if _hopper() and scaled._fp8_pair(args[0], args[1]) else exact


def _hopper():
    return jax.default_backend() == "gpu" and _ffi.WITH_CUDA and _ffi.cuda_compute_capability() == 90


def _rel(out, ref):
    out = np.asarray(jnp.asarray(out).astype(jnp.float32), np.float64)
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize("dtype", [*F8, jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("kb", [1, 2, 8])
def test_values(dtype, kb):
    """Per-row (kb 1), two blocks and 1 x 32 blocks: float32 results within float32 rounding
    of the float64 definition (the operands are exact in float32), and jax.nn's value."""
    args = _operands(kb, 2, 24, 40, 256, kb, dtype)
    out = jaxgemm.scaled_matmul(*args)
    assert out.shape == (2, 24, 40) and out.dtype == jnp.float32
    assert _rel(out, _reference(*args)) <= _bound(args)
    try:  # (jax.nn's has no CPU lowering before JAX 0.11)
        theirs = np.asarray(jax.nn.scaled_matmul(*args), np.float64)
    except NotImplementedError:
        return
    # (On a GPU jax.nn's float32 dot runs at the default precision, tf32: 2.7-3.1e-4 on an H200.)
    assert _rel(out, theirs) <= (1e-5 if jax.default_backend() == "cpu" else max(5e-4, _bound(args)))


def _ffi_gemm_operands(hlo, target="jaxgemm_gemm"):
    """The operand shapes of each `target` custom call in a compiled HLO."""
    return [line.split("operand_layout_constraints=")[1].split("}}")[0] for line in hlo.splitlines()
            if f'custom_call_target="{target}"' in line]  # fmt: skip


def _fp8_kernel_platform():
    """The platform whose FFI handlers take fp8 (a Hopper GPU, or the CPU reference under
    JAXGEMM_CPU=ffi), or skip."""
    platform = jax.default_backend().replace("gpu", "cuda")
    if platform == "cpu" and xla_cpu.enabled("cpu"):
        pytest.skip("the CPU lowers to XLA's dot (JAXGEMM_CPU=xla)")
    if platform == "cuda" and not _hopper():
        pytest.skip("the fp8 kernel needs a Hopper GPU")
    return platform


@pytest.mark.parametrize("dtypes, kb, k, on_kernel", [
    ((jnp.float8_e4m3fn, jnp.float8_e4m3fn), 1, 256, True),
    ((jnp.float8_e4m3fn, jnp.float8_e4m3fn), 2, 256, False),  # block scales: test_block_scaled.py
    ((jnp.float8_e5m2, jnp.float8_e4m3fn), 1, 256, True),  # a gradient's format beside e4m3
    ((jnp.float8_e4m3fn, jnp.float8_e5m2), 1, 256, True),
    ((jnp.float8_e5m2, jnp.float8_e5m2), 1, 256, False),
    ((jnp.float8_e4m3fn, jnp.float8_e4m3fn), 1, 40, False),  # rows of 40 bytes: no TMA
    ((jnp.bfloat16, jnp.bfloat16), 1, 256, False),
])  # fmt: skip
def test_fp8_kernel_runs_where_it_can(dtypes, kb, k, on_kernel):
    """e4m3 operands (or e5m2 beside e4m3) with one scale per row and 16-byte rows are
    multiplied by the GEMM kernel in fp8 (its custom call takes the fp8 operands); anything
    else dequantizes."""
    platform = _fp8_kernel_platform()
    lhs, rhs, ls, rs = _operands(20, 1, 16, 32, k, kb)
    lhs, rhs = lhs.astype(jnp.float32).astype(dtypes[0]), rhs.astype(jnp.float32).astype(dtypes[1])
    assert runs_on_fp8_kernel(lhs, rhs, ls, platform) == on_kernel
    calls = _ffi_gemm_operands(jax.jit(jaxgemm.scaled_matmul).lower(lhs, rhs, ls, rs).compile().as_text())
    fp8 = [jnp.dtype(d).name.replace("float8_", "f8") + "[" for d in dtypes]
    assert (len(calls) == 1 and all(calls[0].count(t) == fp8.count(t) for t in fp8)) == on_kernel, calls
    if on_kernel:  # the scales are the kernel's epilogue operands (no XLA pass after it)
        assert calls[0].count("f32[1,16]") == 1 and calls[0].count("f32[1,32]") == 1, calls
    assert _rel(jaxgemm.scaled_matmul(lhs, rhs, ls, rs), _reference(lhs, rhs, ls, rs)) <= _bound((lhs, rhs))


@pytest.mark.parametrize("transpose_b, split_k, out_dtype, words", [
    (False, 1, jnp.float32, "both be K-major"),
    (True, 2, jnp.float32, "no split-K"),
    (True, 1, jnp.float16, "bfloat16 or float32 output"),
])  # fmt: skip
def test_fp8_ffi_contract(transpose_b, split_k, out_dtype, words):
    """The GEMM handler's fp8 contract (ffi_src/ffi/gemm_decode.h): a clear error, no kernel.
    (Epilogue operands it takes: test_epilogue_operands.py.)"""
    _fp8_kernel_platform()
    lhs, rhs, _, _ = _operands(21, 1, 16, 32, 64, 1)
    rhs = jnp.swapaxes(rhs, 1, 2) if not transpose_b else rhs
    config = jaxgemm.gemm.GemmConfig(transpose_b=transpose_b, out_dtype=jnp.dtype(out_dtype))
    shape = (1, split_k, 16, 32) if split_k > 1 else (1, 16, 32)
    with pytest.raises(Exception, match=words):
        jax.block_until_ready(jaxgemm.gemm.call_gemm_ffi(lhs, rhs, config=config, out_shape=shape, split_k=split_k))


@pytest.mark.parametrize("b, m, n, k", [(1, 1, 8, 16), (3, 17, 130, 80), (1, 300, 200, 1040), (2, 129, 257, 4096)])
@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_fp8_kernel_sizes_and_outputs(b, m, n, k, out_dtype):
    """The fp8 kernel on ragged tiles (M, N not multiples of any tile, K of 16-byte rows
    that end inside a 128-wide k-tile, deep K), batched, into each output dtype: within the
    kernel's bound (float32) or the output dtype's rounding of the float64 definition."""
    _fp8_kernel_platform()
    args = _operands(b * m + n + k, b, m, n, k, 1)
    out = jaxgemm.scaled_matmul(*args, preferred_element_type=out_dtype)
    assert out.shape == (b, m, n) and out.dtype == out_dtype
    bound = {jnp.float32: _bound(args), jnp.bfloat16: 1e-2, jnp.float16: 2e-3}[out_dtype]
    assert _rel(out, _reference(*args)) <= bound


@pytest.mark.parametrize("dtypes", [(jnp.float8_e5m2, jnp.float8_e4m3fn), (jnp.float8_e4m3fn, jnp.float8_e5m2)])
@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16])
def test_fp8_kernel_takes_e5m2_beside_e4m3(dtypes, out_dtype):
    """A gradient's e5m2 beside e4m3, either side (fp8.dense's grad_format="e5m2": dx = dz w^T
    and dw = x^T dz), on ragged tiles, batched, values down to e5m2's subnormals: within
    the kernel's bound (float32) or bfloat16's rounding of the float64 definition."""
    _fp8_kernel_platform()
    b, m, n, k = 2, 129, 257, 1040
    lhs, rhs, ls, rs = _operands(31, b, m, n, k, 1)
    tiny = jnp.asarray(2.0 ** np.random.default_rng(32).integers(-17, 0, (b, m, k)), jnp.float32)
    lhs, rhs = (lhs.astype(jnp.float32) * tiny).astype(dtypes[0]), rhs.astype(jnp.float32).astype(dtypes[1])
    out = jaxgemm.scaled_matmul(lhs, rhs, ls, rs, preferred_element_type=out_dtype)
    assert out.shape == (b, m, n) and out.dtype == out_dtype
    bound = _bound((lhs, rhs)) if out_dtype == jnp.float32 else 1e-2
    assert _rel(out, _reference(lhs, rhs, ls, rs)) <= bound


def test_fp8_ffi_refuses_two_e5m2_operands():
    """e5m2 x e5m2 (two gradients) has no kernel: a clear error from the handler."""
    _fp8_kernel_platform()
    lhs, rhs, _, _ = _operands(22, 1, 16, 32, 64, 1, jnp.float8_e5m2)
    config = jaxgemm.gemm.GemmConfig(transpose_b=True, out_dtype=jnp.dtype(jnp.float32))
    with pytest.raises(Exception, match="float8_e4m3fn beside float8_e5m2"):
        jax.block_until_ready(jaxgemm.gemm.call_gemm_ffi(lhs, rhs, config=config, out_shape=(1, 16, 32)))


@pytest.mark.parametrize("out_dtype, bound", [(jnp.bfloat16, 1e-2), (jnp.float16, 2e-3)])
def test_preferred_element_type(out_dtype, bound):
    args = _operands(3, 1, 16, 32, 512, 4, jnp.float8_e5m2, jnp.bfloat16)
    out = jaxgemm.scaled_matmul(*args, preferred_element_type=out_dtype)
    assert out.dtype == out_dtype and _rel(out, _reference(*args)) <= bound


def test_per_tensor_and_e8m0_scales():
    """Per-tensor scaling (one value in every row's single block) and power-of-two
    float8_e8m0fnu scales (MX formats' kind)."""
    lhs, rhs, _, _ = _operands(4, 1, 8, 16, 128, 1)
    lhs_scales, rhs_scales = jnp.full((1, 8, 1), 0.5), jnp.full((1, 16, 1), 3.0)
    out = jaxgemm.scaled_matmul(lhs, rhs, lhs_scales, rhs_scales)
    assert _rel(out, _reference(lhs, rhs, lhs_scales, rhs_scales)) <= _bound((lhs, rhs))
    e8 = jnp.asarray(2.0 ** np.random.default_rng(5).integers(-3, 3, (1, 8, 4)), jnp.float8_e8m0fnu)
    args = (lhs, rhs, e8, jnp.ones((1, 16, 4), jnp.float8_e8m0fnu))
    assert _rel(jaxgemm.scaled_matmul(*args), _reference(*args)) <= 1e-6


@pytest.mark.parametrize("b, m, n, k, kb", [(1, 0, 4, 128, 1), (0, 4, 4, 128, 1), (1, 4, 4, 0, 1),
                                           (1, 4, 0, 64, 2), (2, 3, 5, 96, 3)])
def test_empty_and_odd_sizes(b, m, n, k, kb):
    """Empty dims (K = 0 sums nothing) and blocks of 32 values of an odd count."""
    args = _operands(b + m + n + k, b, m, n, k, kb)
    out = jax.jit(jaxgemm.scaled_matmul)(*args)
    assert out.shape == (b, m, n)
    if k == 0:
        np.testing.assert_array_equal(out, 0)
    elif out.size:
        assert _rel(out, _reference(*args)) <= _bound(args)


@pytest.mark.parametrize("shapes, dtypes, error, words", [
    (((8, 128), (1, 4, 128), (8, 1), (1, 4, 1)), None, ValueError, "3-D"),
    (((1, 8, 128), (2, 4, 128), (1, 8, 1), (2, 4, 1)), None, ValueError, "agree on B and K"),
    (((1, 8, 128), (1, 4, 64), (1, 8, 1), (1, 4, 1)), None, ValueError, "agree on B and K"),
    (((1, 8, 128), (1, 4, 128), (1, 4, 1), (1, 4, 1)), None, ValueError, "(B, M, KB)"),
    (((1, 8, 128), (1, 200, 128), (1, 8, 1), (1, 3, 1)), None, ValueError, "(B, ceil(N / 128), KB)"),
    (((1, 8, 128), (1, 4, 128), (1, 8, 2), (1, 4, 1)), None, ValueError, "same number KB"),
    (((1, 8, 128), (1, 4, 128), (1, 8, 3), (1, 4, 3)), None, ValueError, "divide K"),
    (((1, 8, 128), (1, 4, 128), (1, 8, 1), (1, 4, 1)), (jnp.int8, jnp.float32), TypeError, "lhs has dtype int8"),
    (((1, 8, 128), (1, 4, 128), (1, 8, 1), (1, 4, 1)), (jnp.float32, jnp.int32), TypeError, "lhs_scales"),
])  # fmt: skip
def test_bad_input(shapes, dtypes, error, words):
    data, scales = dtypes or (jnp.float8_e4m3fn, jnp.float32)
    args = [jnp.ones(s, data if i < 2 else scales) for i, s in enumerate(shapes)]
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")) as info:
        jaxgemm.scaled_matmul(*args)
    assert str(shapes[0]) in str(info.value) or "dtype" in str(info.value)


def test_bad_preferred_element_type():
    args = _operands(0, 1, 8, 8, 128, 1)
    for dtype in (jnp.int32, jnp.float8_e4m3fn):
        with pytest.raises(TypeError, match="preferred_element_type"):
            jaxgemm.scaled_matmul(*args, preferred_element_type=dtype)


def test_jit_and_vmap():
    """vmap over a leading axis of every operand, and with rhs and its scales shared."""
    per = [_operands(10 + i, 2, 16, 24, 256, 2) for i in range(3)]
    stacked = [jnp.stack(xs) for xs in zip(*per)]
    out = jax.jit(jax.vmap(jaxgemm.scaled_matmul))(*stacked)
    for i, args in enumerate(per):
        assert _rel(out[i], _reference(*args)) <= _bound(args)  # (blocks of 128: the block-scaled kernel)
    shared = jax.vmap(jaxgemm.scaled_matmul, in_axes=(0, None, 0, None))(
        stacked[0], per[0][1], stacked[2], per[0][3])
    for i, args in enumerate(per):
        assert _rel(shared[i], _reference(args[0], per[0][1], args[2], per[0][3])) <= _bound(args)


def test_not_differentiable_says_so():
    args = _operands(1, 1, 8, 8, 128, 1, jnp.float32)
    with pytest.raises(NotImplementedError, match="jaxgemm_scaled_matmul"):
        jax.grad(lambda a: jaxgemm.scaled_matmul(a, *args[1:]).sum())(args[0])
