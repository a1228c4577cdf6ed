"""Stream-K on the sm90 kernel: when a persistent grid's last wave would be at most ~half
full, the last items are shared out in equal k ranges and a tile's head adds its tail's partial
sums (gemm/sm90_stream_k.h, gemm/sm90_kernel.cuh). The plan and the walk are checked without
a GPU; on a GPU, JAXGEMM_SM_COUNT shrinks the grid so that small problems get several waves
and a shared tail on every schedule."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgemm import _ffi
from reference import TF32_TOLERANCE, TOLERANCE, random, rel_error, to64
from reference import matmul_operands as _operands
from reference import matmul_reference as _reference

SM90 = 3  # KernelFamily::kSm90
SLOT_BYTES = 128 * 256 * 4  # one fp32 128 x 256 tile per block
FLAG_BYTES = 2 * 4  # one flag per consumer warpgroup


def _workspace(m, n, k, sms, tile=(128, 256), batch=1, split_k=1, kernel=SM90, tf32=False, transpose_a=False):
    return _ffi.gemm_workspace_bytes(m, n, k, batch, sms, split_k, kernel, *tile, tf32, transpose_a)


@pytest.mark.skipif(not _ffi.WITH_CUDA, reason="the plan is built with the CUDA kernels")
def test_stream_k_plan():
    # 8192^3 on 132 SMs: 2048 tiles of 128 x 256 = 15.5 waves; one slot per block.
    assert _workspace(8192, 8192, 8192, 132) == 132 * (SLOT_BYTES + FLAG_BYTES)
    # 2-block clusters: 1024 cluster items on 66 clusters, still one slot per block.
    assert _workspace(8192, 8192, 8192, 132, (256, 256)) == 132 * (SLOT_BYTES + FLAG_BYTES)
    # Never on the pingpong blocks, nor for items shorter than 4096 (2048 x 2112: 1.09 waves).
    assert _workspace(8192, 8192, 8192, 132, (128, 128)) == 0
    assert _workspace(2048, 2112, 2048, 132) == 0 and _workspace(2048, 2112, 4096, 132) > 0
    # The heuristic's schedule for 8192^3 uses it too.
    assert _workspace(8192, 8192, 8192, 132, (0, 0), kernel=0) > 0
    # No stream-K: full waves (66 x 32 = 16 x 132 tiles), a last wave more than ~half full
    # (4096^3: 3.88 waves; 6144^3: 8.73), a single partial wave, split-K, short K, SIMT.
    assert _workspace(8448, 8192, 8192, 132) == 0
    assert _workspace(4096, 4096, 4096, 132) == 0
    assert _workspace(6144, 6144, 6144, 132) == 0
    # 5120^3: 6.06 waves, stream-K.
    assert _workspace(5120, 5120, 5120, 132) == 132 * (SLOT_BYTES + FLAG_BYTES)
    assert _workspace(1024, 1024, 8192, 132) == 0
    assert _workspace(8192, 8192, 8192, 132, split_k=2) == 0
    assert _workspace(8192, 8192, 128, 132) == 0
    assert _workspace(8192, 8192, 8192, 132, kernel=1) == 0
    # Batches count as tiles: 4 x 512 = 2048 tiles.
    assert _workspace(4096, 4096, 4096, 132, batch=4) == 132 * (SLOT_BYTES + FLAG_BYTES)
    # One consumer, 64-row tiles: 64 x N slots and one flag per block. 1024 x 4096 in 64 x 64
    # tiles: 16 x 64 = 1024 items, 7.76 waves: none; 1024 x 2176: 16 x 34 = 544 items, 4.12
    # waves: stream-K; in 64 x 128 tiles 16 x 17 = 272 items, 2.06 waves: stream-K.
    assert _workspace(1024, 4096, 4096, 132, (64, 64)) == 0
    assert _workspace(1024, 2176, 4096, 132, (64, 64)) == 132 * (64 * 64 * 4 + 4)
    assert _workspace(1024, 2176, 4096, 132, (64, 128)) == 132 * (64 * 128 * 4 + 4)
    # An unknown tile plans nothing (the launch then refuses it).
    assert _workspace(5120, 5120, 5120, 132, (192, 256)) == 0
    assert _workspace(5120, 5120, 5120, 132, (192, 128)) == 0
    assert _workspace(5120, 5120, 5120, 132, (64, 256)) == 0


@pytest.mark.skipif(not _ffi.WITH_CUDA, reason="the plan is built with the CUDA kernels")
@pytest.mark.parametrize("transpose_a", [False, True])
def test_stream_k_plan_for_tf32(transpose_a):
    """tf32 shares a last wave out only on 2-block clusters and only where it is at most ~a
    third full (a shared item ran ~1.45x a whole one's time there, and ~2.1x on single
    blocks); the heuristic then takes the clusters, and otherwise single 128 x 256 blocks."""
    tf32 = dict(tf32=True, transpose_a=transpose_a)
    # 5120^3: 400 cluster items on 66 clusters, the last wave 6% full.
    assert _workspace(5120, 5120, 5120, 132, (256, 256), **tf32) == 132 * (SLOT_BYTES + FLAG_BYTES)
    assert _workspace(5120, 5120, 5120, 132, (0, 0), kernel=0, **tf32) == 132 * (SLOT_BYTES + FLAG_BYTES)
    assert _ffi.sm90_choice(5120, 5120, 5120, 1, 132, True, transpose_a)[:2] == (256, 256)
    # 8192^3: the last wave 52% full, whole waves (16-bit inputs share it out).
    assert _workspace(8192, 8192, 8192, 132, (256, 256), **tf32) == 0
    assert _workspace(8192, 8192, 8192, 132, (256, 256)) > 0
    assert _ffi.sm90_choice(8192, 8192, 8192, 1, 132, True, transpose_a)[:2] == (128, 256)
    assert _ffi.sm90_choice(4096, 4096, 4096, 1, 132, True, transpose_a)[:2] == (128, 256)
    # Single blocks never.
    for tile in ((128, 256), (64, 64), (64, 128), (128, 128)):
        assert _workspace(5120, 5120, 5120, 132, tile, **tf32) == 0


# (workers, last wave's items, k-tiles per item): clusters at 8192^3 / 4096^3, 132 blocks,
# few workers, and item lengths that are prime or barely longer than a range's share.
WALKS = [(66, 34, 128), (66, 58, 64), (132, 68, 128), (2, 1, 4), (3, 2, 5), (7, 1, 129), (66, 65, 128),
         (66, 1, 128), (5, 3, 1)]


@pytest.mark.parametrize("workers, last_wave, item_k_tiles", WALKS)
def test_stream_k_walk_covers_every_k_tile_once_in_step(workers, last_wave, item_k_tiles):
    """The kernel's walk over the shared items (a last wave and one full one, as planned):
    every k-tile of every item is multiplied once; an item split in two has its tail first
    in the next worker's range (the partial sums the head adds) and its head last in this
    worker's; and the workers stay in step over K: at time t of its range a worker multiplies
    k-tile t mod item_k_tiles, or (t - its range's length) mod item_k_tiles in a closing head,
    i.e. at most two phases over K across all workers (one per worker before)."""
    items = workers + last_wave
    walk = _ffi.sm90_stream_k_walk(items, item_k_tiles, workers)
    seen = {item: [] for item in range(items)}
    by_worker = {w: [piece for piece in walk if piece[0] == w] for w in range(workers)}
    assert sum(len(p) for p in by_worker.values()) == len(walk)
    for w, pieces in by_worker.items():
        length = sum(k_tiles for *_, k_tiles, _ in pieces)
        assert item_k_tiles <= length <= 2 * item_k_tiles, (w, pieces)
        t = 0
        for i, (_, item, first_k, k_tiles, fixup) in enumerate(pieces):
            assert 0 < k_tiles <= item_k_tiles and 0 <= first_k < item_k_tiles, pieces
            ks = [(first_k + j) % item_k_tiles for j in range(k_tiles)]
            phase = -length if fixup == 2 else 0
            assert ks == [(t + j + phase) % item_k_tiles for j in range(k_tiles)], (w, pieces)
            assert fixup != 1 or i == 0, pieces  # a tail opens a range
            assert fixup != 2 or i == len(pieces) - 1, pieces  # a head closes it
            assert (fixup == 0) == (k_tiles == item_k_tiles), pieces
            seen[item].append((w, fixup, ks))
            t += k_tiles
    for item, parts in seen.items():
        assert sorted(k for *_, ks in parts for k in ks) == list(range(item_k_tiles)), (item, parts)
        fixups = sorted(fixup for _, fixup, _ in parts)
        assert fixups in ([0], [1, 2]), (item, parts)
        if fixups == [1, 2]:
            (w_tail,) = [w for w, fixup, _ in parts if fixup == 1]
            (w_head,) = [w for w, fixup, _ in parts if fixup == 2]
            assert w_tail == w_head + 1, (item, parts)


def test_stream_k_walk_refuses_bad_counts():
    with pytest.raises(ValueError, match="positive counts"):
        _ffi.sm90_stream_k_walk(0, 4, 2)
    with pytest.raises(ValueError, match="2\\^31"):
        _ffi.sm90_stream_k_walk(1 << 20, 1 << 12, 2)


def _skip_unless_hopper():
    if _ffi.cuda_compute_capability() != 90:
        pytest.skip("the sm90 kernel needs compute capability 9.0")


def _sm_counts_with_stream_k(m, n, k, tile, batch, count=2):
    """The first `count` simulated SM counts (from 3) whose grid shares a tail stream-K."""
    found = [sms for sms in range(3, 40) if _workspace(m, n, k, sms, tile, batch) > 0]
    assert len(found) >= count, (m, n, k, tile, batch)
    return found[:count]


def _kernel_workspace(a, b, config, sms, monkeypatch):
    """The stream-K workspace the lowering allocates for this call on `sms` SMs."""
    from jaxgemm.gemm import gemm_workspace_bytes

    monkeypatch.setenv("JAXGEMM_SM_COUNT", str(sms))
    return gemm_workspace_bytes(a.shape, b.shape, a.dtype, config, 1, "cuda")


# (m, n, k): ragged M, N and K (N and K multiples of 8: a forced kernel gets no padding).
STREAM_K_SHAPES = [(500, 696, 1000), (1000, 536, 520), (300, 1096, 4104), (776, 776, 256)]
LAYOUTS = [(False, False), (True, True), (False, True), (True, False)]


SM90_TILES = [(128, 64), (128, 128), (128, 256), (256, 256), (64, 64), (64, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tile, dtype", [(t, jnp.bfloat16) for t in SM90_TILES] + [((256, 256), jnp.float32)]
)
def test_gpu_stream_k_on_every_sm90_tile(tile, dtype, monkeypatch):
    """Every schedule, every layout, ragged M / N / K, batches; float32 as tf32 (on the
    2-block clusters, where alone tf32 shares a last wave out). Outputs are poisoned
    (JAXGEMM_POISON_OUTPUTS in the GPU run): an unwritten tile shows. Runs twice:
    stream-K's fixed summation order gives the same bits."""
    from jaxgemm.gemm import GemmConfig, _gemm, _tf32_operands

    _skip_unless_hopper()
    # The mechanism on small problems and every schedule: past the rule that keeps it to
    # long items and cooperative blocks (Sm90StreamKMaxFillPercent).
    monkeypatch.setenv("JAXGEMM_STREAM_K_MAX_FILL", "55")
    rng = np.random.default_rng(hash((tile, str(dtype))) % 2**32)
    tf32 = dtype == jnp.float32
    tolerance = TF32_TOLERANCE if tf32 else TOLERANCE[jnp.dtype(dtype)]
    case = 0
    for m, n, k in STREAM_K_SHAPES:
        batch = 2 if case % 3 == 0 else 1
        for nth in range(2):
            ta, tb = LAYOUTS[case % 4]
            case += 1
            if ta and not tf32:
                m = -(-m // 8) * 8  # 16-byte rows of stored A
            config = GemmConfig(ta, tb, tf32, jnp.dtype(dtype), split_k=1, kernel="sm90", tile=tile)
            batch_dims = (batch,) if batch > 1 else ()
            a, b = _operands(rng, m, n, k, dtype, ta, tb, batch_dims, batch_dims)
            # The call as the kernel gets it (tf32 NN computes D^T, over n x m tiles).
            ka, kb, kconfig = _tf32_operands(a, b, config, plain=True) if tf32 else (a, b, config)
            sms = [s for s in range(3, 40) if _kernel_workspace(ka, kb, kconfig, s, monkeypatch) > 0]
            assert len(sms) > nth, (m, n, k, ta, tb, batch)
            monkeypatch.setenv("JAXGEMM_SM_COUNT", str(sms[nth]))
            fn = jax.jit(lambda a, b, config=config: _gemm(a, b, config))
            out = fn(a, b)
            err = rel_error(out, _reference(a, b, ta, tb))
            assert err <= tolerance, (m, n, k, sms, ta, tb, batch, err)
            assert np.array_equal(np.asarray(fn(a, b)), np.asarray(out)), (m, n, k, sms, ta, tb, batch)
            jax.clear_caches()  # the next SM count must be planned anew


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [(128, 128), (128, 256), (256, 256)])
def test_gpu_stream_k_with_epilogues(tile, monkeypatch):
    """The head's worker applies the epilogue to the summed tile: the fused TMA-store one
    (bias, gelu, Aux) and the general one (C, residual)."""
    import jaxgemm
    from jaxgemm.epilogue import EpilogueConfig, fused_matmul
    from jaxgemm.gemm import GemmConfig

    _skip_unless_hopper()
    rng = np.random.default_rng(31)
    dtype = jnp.bfloat16
    m, n, k = 1100, 536, 1000
    monkeypatch.setenv("JAXGEMM_STREAM_K_MAX_FILL", "55")  # short K, pingpong: past the rule
    monkeypatch.setenv("JAXGEMM_SM_COUNT", str(_sm_counts_with_stream_k(m, n, k, tile, 1, 1)[0]))
    a, b = random(rng, (m, k), dtype), random(rng, (k, n), dtype)
    bias, c, res = random(rng, (n,), dtype), random(rng, (m, n), dtype), random(rng, (m, n), dtype)
    prod = to64(a) @ to64(b)
    tol = TOLERANCE[jnp.dtype(dtype)]
    config = GemmConfig(False, False, False, jnp.dtype(dtype), kernel="sm90", tile=tile)
    y, z = fused_matmul(a, b, None, bias, None, config, EpilogueConfig("gelu", 0.0, True))
    z_ref = prod + to64(bias)
    assert rel_error(z, z_ref) <= tol
    assert rel_error(y, np.asarray(jax.nn.gelu(jnp.asarray(z_ref)), np.float64)) <= tol
    y = fused_matmul(a, b, c, None, res, config, EpilogueConfig("relu", 0.5, False))
    assert rel_error(y, np.maximum(prod + 0.5 * to64(c), 0) + to64(res)) <= tol
    # The public API, with the heuristic's schedule.
    y = jaxgemm.matmul(a, b, bias=bias, activation="relu")
    assert rel_error(y, np.maximum(z_ref, 0)) <= tol
    jax.clear_caches()
