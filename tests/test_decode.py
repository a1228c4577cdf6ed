"""The decode kernel (ffi_src/gemm/decode_kernel.cuh): products of at most 16 rows of 16-bit
inputs, whose warps split K within a block and across a cluster and add the partial sums in
a fixed order; it runs only when asked for. Its launch plan is checked on the host; the kernel
itself on a Hopper GPU against float64, with outputs poisoned, under every cluster size."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgemm import _ffi
from reference import TOLERANCE, random, rel_error
from reference import matmul_operands as _operands
from reference import matmul_reference as _reference
from test_epilogue import ACTS, _epilogue_reference

needs_cuda_build = pytest.mark.skipif(not _ffi.WITH_CUDA, reason="built without CUDA")


def _decode_gemm(a, b, ta, tb, out_dtype, split_k=1):
    from jaxgemm.gemm import GemmConfig, gemm_product

    config = GemmConfig(ta, tb, False, jnp.dtype(out_dtype), split_k=split_k, kernel="decode")
    return jax.jit(lambda a, b: gemm_product(a, b, config))(a, b)


def _skip_unless_hopper():
    if _ffi.cuda_compute_capability() != 90:
        pytest.skip("the decode kernel runs on compute capability 9.0")


@needs_cuda_build
@pytest.mark.parametrize("n,k,batch", [(4096, 4096, 1), (14336, 4096, 1), (4096, 14336, 1), (1024, 4096, 1),
                                       (128256, 4096, 1), (4096, 32, 1), (256, 64, 4), (7, 100000, 1)])
def test_decode_plan_fills_the_gpu_without_a_second_wave(n, k, batch):
    """132 SMs, two blocks each: the clusters grow while the grid stays resident at once and
    each warp keeps at least two chunks of 32 k; at most 8 blocks per cluster."""
    sms = 132
    column_blocks, cluster = _ffi.decode_plan(16, n, k, batch, sms)
    assert column_blocks == -(-n // 128)
    assert cluster in (1, 2, 4, 8)
    blocks = column_blocks * batch * cluster
    if cluster > 1:
        assert blocks <= 2 * sms
        assert -(-k // 32) >= 4 * (cluster // 2) * 2
    if cluster < 8:  # it stopped for a reason
        assert blocks * 2 > 2 * sms or -(-k // 32) < 4 * cluster * 2


def test_decode_is_a_kernel_family_name():
    """GemmConfig takes "decode"; a misspelt family is a ValueError naming the choices."""
    from jaxgemm.gemm import GemmConfig

    assert GemmConfig(kernel="decode").kernel == "decode"
    with pytest.raises(ValueError, match="decode"):
        GemmConfig(kernel="decoder")


def test_forced_decode_through_the_ffi_path_on_any_backend():
    """The "decode" family id goes through the primitive, its lowering and the handler: off a
    Hopper GPU only the CPU handler takes it (its reference ignores the family), which CI
    runs; on Hopper the kernel itself."""
    if jax.default_backend() == "gpu" and _ffi.cuda_compute_capability() != 90:
        pytest.skip("the decode kernel runs on compute capability 9.0")
    rng = np.random.default_rng(3)
    for tb in (False, True):
        a, b = _operands(rng, 5, 136, 200, jnp.bfloat16, False, tb)
        out = _decode_gemm(a, b, False, tb, jnp.bfloat16)
        assert out.shape == (5, 136) and out.dtype == jnp.bfloat16
        assert rel_error(out, _reference(a, b, False, tb)) <= TOLERANCE[jnp.dtype(jnp.bfloat16)], tb


# --- GPU-only ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("cluster_cap", [None, "1", "2"])
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_gpu_decode_kernel_matches_float64(dtype, cluster_cap, monkeypatch):
    """Forced onto the decode kernel: both layouts of B (A stored (m, k): the kernel's only
    one), rows 1-16, N and K ragged against the 32-wide warp strips, the 128-wide blocks and
    the 32-deep chunks (stored rows stay multiples of 8: a forced kernel gets no padding),
    clusters of 1-8 blocks, batches with a broadcast operand, float32 outputs and split-K
    partials. Run twice: the same bits (fixed summation order). cluster_cap: at most that many
    blocks per cluster (JAXGEMM_DECODE_CLUSTER, read at launch)."""
    _skip_unless_hopper()
    if cluster_cap:
        monkeypatch.setenv("JAXGEMM_DECODE_CLUSTER", cluster_cap)
    rng = np.random.default_rng(hash(str(dtype)) % 2**32)
    # (m, n, k, transpose_b): N-major B needs N % 8 == 0, K-major B and A need K % 8 == 0.
    cases = [(1, 8, 8, False), (7, 127, 104, True), (16, 136, 40, False), (3, 520, 1000, True),
             (16, 4104, 4104, False), (9, 4096, 4096, True), (16, 8, 20000, False), (5, 1001, 264, True),
             (2, 264, 14336, False), (16, 14336, 4096, True)]
    batches = [((), ()), ((3,), (3,)), ((), (2,)), ((2,), ())]
    for i, (m, n, k, tb) in enumerate(cases):
        batch_a, batch_b = batches[i % len(batches)]
        out_dtype = jnp.dtype(dtype) if i % 2 == 0 else jnp.dtype(jnp.float32)
        split_k = 3 if i % 5 == 4 else 1
        a, b = _operands(rng, m, n, k, dtype, False, tb, batch_a, batch_b)
        out = _decode_gemm(a, b, False, tb, out_dtype, split_k)
        assert out.dtype == out_dtype
        err = rel_error(out, _reference(a, b, False, tb))
        assert err <= TOLERANCE[jnp.dtype(dtype)], (m, n, k, tb, batch_a, batch_b, out_dtype, split_k, err)
        again = _decode_gemm(a, b, False, tb, out_dtype, split_k)
        assert np.array_equal(np.asarray(out), np.asarray(again)), (m, n, k, tb)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_gpu_decode_kernel_fused_epilogue(dtype):
    """alpha, beta C, bias, every activation, residual and aux, applied by the cluster's
    blocks to their slices of the tile."""
    _skip_unless_hopper()
    from jaxgemm.epilogue import EpilogueConfig, fused_matmul
    from jaxgemm.gemm import GemmConfig

    rng = np.random.default_rng(5)
    m, n, k = 13, 264, 3000
    for act in ACTS:
        a, b = random(rng, (m, k), dtype), random(rng, (k, n), dtype)
        bias, c, res = random(rng, (n,), dtype), random(rng, (m, n), dtype), random(rng, (m, n), dtype)
        config = GemmConfig(False, False, False, jnp.dtype(dtype), kernel="decode", alpha=1.5)
        y, z = fused_matmul(a, b, c, bias, res, config, EpilogueConfig(act, 0.25, True))
        ry, rz = _epilogue_reference(a, b, False, False, bias, act, 1.5, 0.25, c, res)
        tol = TOLERANCE[jnp.dtype(dtype)]
        assert rel_error(z, rz) <= tol and rel_error(y, ry) <= tol, act


@pytest.mark.gpu
@pytest.mark.parametrize("m,ta", [(17, False), (16, True)])
def test_gpu_decode_kernel_refuses_what_it_cannot_take(m, ta):
    """More than 16 rows, or A stored (k, m): an error naming the kernel, not a wrong answer."""
    _skip_unless_hopper()
    rng = np.random.default_rng(0)
    a, b = _operands(rng, m, 64, 64, jnp.bfloat16, ta, False)
    with pytest.raises(Exception, match="decode kernel"):
        jax.block_until_ready(_decode_gemm(a, b, ta, False, jnp.bfloat16))
