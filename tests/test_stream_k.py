"""Stream-K on the sm90 kernel: when a persistent grid's last wave would be at most ~half
full, the last items are shared out in equal k ranges and a tile's head adds its tail's partial
sums (gemm/sm90/stream_k.h, gemm/sm90/launch.cuh). The plan and the walk are checked without
a GPU; on a GPU, JAXGEMM_SM_COUNT shrinks the grid so that small problems get several waves
and a shared tail on every schedule."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
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
    # The pingpong blocks only where the last wave is at most ~30% full (8192^3: 4096 tiles of
    # 128 x 128, the last wave 3% full; 4096^3: 76%); never for items shorter than 4096
    # (2048 x 2112: 1.09 waves).
    assert _workspace(8192, 8192, 8192, 132, (128, 128)) == 132 * (128 * 128 * 4 + FLAG_BYTES)
    assert _workspace(4096, 4096, 4096, 132, (128, 128)) == 0
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
    # A single wave at most ~half full, with deep K: every item is shared (1536^2 x 14336:
    # 72 tiles of 128 x 256 on 132 SMs, 36 clusters on 66), the grid keeps every SM. Not
    # where an item would go to more than 4 workers (1024^2 x 8192: 32 tiles), ranges would
    # be shorter than 2048 (1536 x 1024 x 4096) or the wave is fuller (768 x 4096 x 14336:
    # 96 tiles).
    assert _workspace(1536, 1536, 14336, 132) == 132 * (SLOT_BYTES + FLAG_BYTES)
    assert _workspace(1536, 1536, 14336, 132, (256, 256)) == 132 * (SLOT_BYTES + FLAG_BYTES)
    assert _workspace(1536, 1536, 4096, 132) > 0 and _workspace(1536, 1024, 4096, 132) == 0
    assert _workspace(768, 4096, 14336, 132) == 0
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
    assert _workspace(5120, 5120, 5120, 132, (192, 64)) == 0
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


@pytest.mark.skipif(not _ffi.WITH_CUDA, reason="the heuristic is built with the CUDA kernels")
def test_sm90_heuristic_shares_few_deep_tiles():
    """Session 30 (bf16, H200, against XLA; the old pick forced in the same process): products
    of few output tiles and deep K now share their work out stream-K. 1536^2 x 14336 with A
    stored (k, m): 0.654 -> 0.892 (a shared single wave of 2-block clusters); 1536^2 x 4096
    TT 0.665 -> 0.853 and 6144 x 384 x 8192 TN 0.655 -> 0.833 (pingpong tiles, the short last
    wave shared); 384 x 6144 x 14336 0.836 -> 0.937 (128 x 256, unsplit, shared). Where one
    pingpong tile per block leaves a quarter of the SMs idle, whole tiles stay (3072 x 512 x
    14336: 0.875 whole, 0.821 shared)."""

    def stream_k(m, n, k, ta, tb):
        tile_m, tile_n, split = _ffi.sm90_choice(m, n, k, 1, 132, False, ta, tb)
        workspace = _ffi.gemm_workspace_bytes(m, n, k, 1, 132, split, SM90, tile_m, tile_n, False, ta, tb)
        return (tile_m, tile_n, split), workspace > 0

    assert stream_k(1536, 1536, 14336, True, False) == ((256, 256, 1), True)
    assert stream_k(1536, 1536, 4096, True, True) == ((128, 128, 1), True)
    assert stream_k(6144, 384, 8192, True, False) == ((128, 128, 1), True)
    assert stream_k(384, 6144, 14336, False, False) == ((128, 256, 1), True)
    assert stream_k(3072, 512, 14336, False, False) == ((128, 128, 1), False)
    # The large products keep their schedules.
    assert stream_k(8192, 8192, 8192, False, False)[0] == (256, 256, 1)
    assert stream_k(4096, 4096, 4096, False, False) == ((256, 256, 1), False)


@pytest.mark.skipif(not _ffi.WITH_CUDA, reason="the heuristic is built with the CUDA kernels")
def test_sm90_heuristic_weighs_a_full_shared_last_wave():
    """Session 36 (bf16, H200, x XLA, the old pick -> the new): 1.45 waves of the cooperative
    tiles shared out stream-K ran far behind the pingpong's whole tiles: 768 x 8192 x 4096
    0.80 -> 0.96, 512 x 12288 x 4096 0.814 -> 0.983, 384 x 16384 x 4096 0.682 -> 0.971,
    768 x 8192 x 8192 0.912 -> 0.976. Many waves with a half-full last one keep stream-K."""
    for m, n, k in ((768, 8192, 4096), (1024, 6144, 4096), (512, 12288, 4096), (384, 16384, 4096),
                    (768, 8192, 8192), (384, 16384, 14336)):
        assert _ffi.sm90_choice(m, n, k, 1, 132) == (128, 128, 1), (m, n, k)
    assert _ffi.sm90_choice(8192, 8192, 8192, 1, 132) == (256, 256, 1)
    assert _ffi.gemm_workspace_bytes(8192, 8192, 8192, 1, 132, 1, SM90, 256, 256) > 0


# (workers, last wave's items, k-tiles per item): clusters at 8192^3 / 4096^3, 132 blocks,
# few workers, and item lengths that are prime or barely longer than a range's share.
WALKS = [(66, 34, 128), (66, 58, 64), (132, 68, 128), (2, 1, 4), (3, 2, 5), (7, 1, 129), (66, 65, 128),
         (66, 1, 128), (5, 3, 1)]
# (workers, items, k-tiles per item) of a single shared wave: 1536^2 x 14336 in 128 x 256
# tiles and in 2-block clusters, 768 x 4096 x 14336, a quarter-full grid (every item on 4-5
# workers), ranges of two or three k-tiles, and prime counts.
SINGLE_WAVE_WALKS = [(132, 72, 224), (66, 36, 224), (132, 96, 224), (132, 33, 64), (13, 12, 3), (47, 12, 129),
                     (31, 7, 17)]


def _pieces_by_worker(walk, workers):
    by_worker = {w: [piece for piece in walk if piece[0] == w] for w in range(workers)}
    assert sum(len(p) for p in by_worker.values()) == len(walk)
    return by_worker


def _check_items(walk, items, item_k_tiles):
    """Every k-tile of every item is multiplied once; an item has one head (or is whole), in
    the first of its workers' ranges, and that head adds the partial sums of all the others,
    which store them."""
    seen = {item: [] for item in range(items)}
    for w, item, first_k, k_tiles, fixup, partners in walk:
        assert 0 < k_tiles <= item_k_tiles and 0 <= first_k < item_k_tiles, walk
        assert (fixup == 2) == (partners > 0), walk
        seen[item].append((w, fixup, partners, [(first_k + j) % item_k_tiles for j in range(k_tiles)]))
    for item, parts in seen.items():
        assert sorted(k for *_, ks in parts for k in ks) == list(range(item_k_tiles)), (item, parts)
        head, *others = sorted(parts)
        assert head[1] != 1 and all(part[1] == 1 for part in others), (item, parts)
        assert head[2] == len(others), (item, parts)
        assert sorted(w for w, *_ in parts) == list(range(head[0], head[0] + len(parts))), (item, parts)
    return seen


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
    for w, pieces in _pieces_by_worker(walk, workers).items():
        length = sum(piece[3] for piece in pieces)
        assert item_k_tiles <= length <= 2 * item_k_tiles, (w, pieces)
        t = 0
        for i, (_, item, first_k, k_tiles, fixup, partners) in enumerate(pieces):
            ks = [(first_k + j) % item_k_tiles for j in range(k_tiles)]
            phase = -length if fixup == 2 else 0
            assert ks == [(t + j + phase) % item_k_tiles for j in range(k_tiles)], (w, pieces)
            assert fixup != 1 or i == 0, pieces  # a tail opens a range
            assert fixup != 2 or (i == len(pieces) - 1 and partners == 1), pieces  # a head closes it
            assert (fixup == 0) == (k_tiles == item_k_tiles), pieces
            t += k_tiles
    for item, parts in _check_items(walk, items, item_k_tiles).items():
        assert len(parts) <= 2, (item, parts)


@pytest.mark.parametrize("workers, items, item_k_tiles", SINGLE_WAVE_WALKS)
def test_stream_k_walk_of_a_single_shared_wave(workers, items, item_k_tiles):
    """Fewer items than workers: ranges shorter than an item, so an item may have middle
    pieces (ranges wholly inside it) besides its head and tail; the head adds all of their
    partial sums. Each worker stores at most one partial tile (its first piece: one
    workspace slot each), and the workers stay in step over K: at any time all the workers
    together multiply only a few distinct k-tiles of their items (item_k_tiles / range + 1
    phases, each maybe split in two by ranges one k-tile longer), so that concurrent tiles
    share operand slices in L2 (a phase per worker would be a slice per worker)."""
    walk = _ffi.sm90_stream_k_walk(items, item_k_tiles, workers)
    at_time = {}
    for w, pieces in _pieces_by_worker(walk, workers).items():
        assert pieces and sum(piece[3] for piece in pieces) < item_k_tiles + 1, (w, pieces)
        assert all(fixup != 1 for *_, fixup, _ in pieces[1:]), pieces
        assert all(fixup != 2 for *_, fixup, _ in pieces[:-1]), pieces
        t = 0
        for _, item, first_k, k_tiles, fixup, _ in pieces:
            for j in range(k_tiles):
                at_time.setdefault(t + j, set()).add((first_k + j) % item_k_tiles)
            t += k_tiles
    seen = _check_items(walk, items, item_k_tiles)
    assert max(len(parts) for parts in seen.values()) > 2 or workers < 2 * items
    # Ranges differ in length by one k-tile, which can double each phase.
    shortest = min(sum(p[3] for p in walk if p[0] == w) for w in range(workers))
    phases = 2 * (-(-item_k_tiles // shortest) + 1)
    assert max(len(ks) for ks in at_time.values()) <= phases, (phases, at_time)


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


SM90_TILES = [(128, 64), (128, 128), (128, 256), (256, 256), (64, 64), (64, 128), (192, 128), (160, 128)]
SWAPPED_TILE = (160, 128)  # takes A stored (m, k) only: the tests give it that layout


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tile, dtype", [(t, jnp.bfloat16) for t in SM90_TILES] + [((256, 256), jnp.float32)]
)
def test_gpu_stream_k_on_every_sm90_tile(tile, dtype, monkeypatch):
    """Every schedule, every layout, ragged M / N / K, batches; float32 as tf32 (on the
    2-block clusters, where alone tf32 shares a last wave out). Outputs are poisoned
    (JAXGEMM_POISON_OUTPUTS in the GPU run): an unwritten tile shows. Runs twice:
    stream-K's fixed summation order gives the same bits."""
    from jaxgemm.gemm import GemmConfig, gemm_product, tf32_operands

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
            ta = ta and tile != SWAPPED_TILE
            case += 1
            if ta and not tf32:
                m = -(-m // 8) * 8  # 16-byte rows of stored A
            config = GemmConfig(ta, tb, tf32, jnp.dtype(dtype), split_k=1, kernel="sm90", tile=tile)
            batch_dims = (batch,) if batch > 1 else ()
            a, b = _operands(rng, m, n, k, dtype, ta, tb, batch_dims, batch_dims)
            # The call as the kernel gets it (tf32 NN computes D^T, over n x m tiles).
            ka, kb, kconfig = tf32_operands(a, b, config, plain=True) if tf32 else (a, b, config)
            sms = [s for s in range(3, 40) if _kernel_workspace(ka, kb, kconfig, s, monkeypatch) > 0]
            assert len(sms) > nth, (m, n, k, ta, tb, batch)
            monkeypatch.setenv("JAXGEMM_SM_COUNT", str(sms[nth]))
            fn = jax.jit(lambda a, b, config=config: gemm_product(a, b, config))
            out = fn(a, b)
            err = rel_error(out, _reference(a, b, ta, tb))
            assert err <= tolerance, (m, n, k, sms, ta, tb, batch, err)
            assert np.array_equal(np.asarray(fn(a, b)), np.asarray(out)), (m, n, k, sms, ta, tb, batch)
            jax.clear_caches()  # the next SM count must be planned anew


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [(128, 128), (128, 256), (256, 256), (192, 128), (160, 128)])
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


def _items(m, n, tile, batch=1):
    """Work items of a forced sm90 tile, and its workers per SM (2-block clusters: half)."""
    block_m, cluster = (128, 2) if tile == (256, 256) else (tile[0], 1)
    return -(-(-(-m // block_m)) // cluster) * -(-n // min(tile[1], 256)) * batch, cluster


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tile, dtype", [(t, jnp.bfloat16) for t in ((128, 256), (256, 256), (128, 128), (64, 128), (192, 128), (160, 128))]
    + [((128, 256), jnp.float32)]
)
def test_gpu_stream_k_single_shared_wave(tile, dtype, monkeypatch):
    """Fewer items than workers, deep K: every item is shared, by up to five workers (middle
    pieces; a head adds up to four partial tiles). Per shape, three grids: from barely more
    workers than items to two to four times as many. Ragged M / N / K, layouts, a batch; outputs
    poisoned; the same bits twice."""
    from jaxgemm.gemm import GemmConfig, gemm_product, tf32_operands

    _skip_unless_hopper()
    monkeypatch.setenv("JAXGEMM_STREAM_K_MAX_FILL", "100")  # any fill: the mechanism on small grids
    rng = np.random.default_rng(hash((tile, str(dtype), "single")) % 2**32)
    tf32 = dtype == jnp.float32
    tolerance = TF32_TOLERANCE if tf32 else TOLERANCE[jnp.dtype(dtype)]
    for (m, n, k, batch), (ta, tb) in zip([(500, 696, 8200, 1), (264, 1000, 12304, 2)], [(False, False), (True, True)]):
        ta = ta and tile != SWAPPED_TILE
        config = GemmConfig(ta, tb, tf32, jnp.dtype(dtype), split_k=1, kernel="sm90", tile=tile)
        batch_dims = (batch,) if batch > 1 else ()
        a, b = _operands(rng, m, n, k, dtype, ta, tb, batch_dims, batch_dims)
        ka, kb, kconfig = tf32_operands(a, b, config, plain=True) if tf32 else (a, b, config)
        items, cluster = _items(ka.shape[-1] if kconfig.transpose_a else ka.shape[-2],
                                kb.shape[-2] if kconfig.transpose_b else kb.shape[-1], tile, batch)
        sms = [s for s in range(3, 133) if s // cluster > items and _kernel_workspace(ka, kb, kconfig, s, monkeypatch) > 0]
        assert len(sms) >= 3 and sms[-1] // cluster >= min(2 * items, 132 // cluster), (m, n, k, tile, items, sms)
        for count in (sms[0], sms[len(sms) // 2], sms[-1]):
            monkeypatch.setenv("JAXGEMM_SM_COUNT", str(count))
            fn = jax.jit(lambda a, b, config=config: gemm_product(a, b, config))
            out = fn(a, b)
            err = rel_error(out, _reference(a, b, ta, tb))
            assert err <= tolerance, (m, n, k, count, ta, tb, batch, err)
            assert np.array_equal(np.asarray(fn(a, b)), np.asarray(out)), (m, n, k, count, ta, tb, batch)
            jax.clear_caches()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_gpu_few_rows_shared_wave(dtype):
    """Products of at most 64 rows whose 64 x 64 tiles the heuristic splits K over (XLA
    summing the fp32 partials) can instead share each tile out stream-K by 2 or 4 workers
    on a grid of tiles x share blocks, the heads adding the partial tiles in the kernel: the
    heuristic's pick below K = 8192, and any one-slab call's (a fused epilogue's). Every
    layout, ragged N and K, a batch, 4 workers per tile, the fused epilogue with Aux; outputs
    poisoned; the same bits twice."""
    from jaxgemm.gemm import GemmConfig, gemm_product

    _skip_unless_hopper()
    sms = _ffi.cuda_sm_count()
    rng = np.random.default_rng(hash(("few rows shared", str(dtype))) % 2**32)
    tolerance = TOLERANCE[jnp.dtype(dtype)]
    assert _ffi.sm90_choice(16, 4096, 4096, 1, sms)[2] == 1
    # (m, n, k, batch): 64 tiles by 2; 63 tiles (ragged N) by 2; ragged K; 32 tiles by 4;
    # 2 x 32 tiles by 2; 64 rows and K past the heuristic's bound.
    shapes = [(1, 4096, 4096, 1), (16, 4000, 4104, 1), (7, 4096, 5000, 1), (16, 2048, 8192, 1), (16, 2048, 4096, 2),
              (64, 4096, 9000, 1)]
    for (m, n, k, batch), (ta, tb) in zip(shapes, LAYOUTS + LAYOUTS):
        assert _ffi.sm90_grid_sms(m, n, k, batch, sms, 1, False, ta, tb) < sms, (m, n, k, batch)
        batch_dims = (batch,) if batch > 1 else ()
        a, b = _operands(rng, m, n, k, dtype, ta, tb, batch_dims, batch_dims)
        config = GemmConfig(ta, tb, False, jnp.dtype(dtype), split_k=1)
        fn = jax.jit(lambda a, b, config=config: gemm_product(a, b, config))
        out = fn(a, b)
        err = rel_error(out, _reference(a, b, ta, tb))
        assert err <= tolerance, (m, n, k, batch, ta, tb, err)
        assert np.array_equal(np.asarray(fn(a, b)), np.asarray(out)), (m, n, k, batch, ta, tb)
    # The fused epilogue on a shared wave: bias, gelu and the pre-activation.
    a, b = _operands(rng, 16, 4096, 8192, dtype, False, False)
    bias = random(rng, (4096,), dtype)
    y, z = jax.jit(lambda a, b, bias: jaxgemm.matmul(a, b, bias=bias, activation="gelu",
                                                     return_pre_activation=True))(a, b, bias)
    z_ref = _reference(a, b) + to64(bias)
    assert rel_error(z, z_ref) <= tolerance
    assert rel_error(y, np.asarray(jax.nn.gelu(jnp.asarray(z_ref, jnp.float32)), np.float64)) <= tolerance
