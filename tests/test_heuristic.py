"""Properties of the Hopper heuristic's picks (ffi_src/gemm/sm90/heuristic.cu) over a grid
of problems, computed on the host (no GPU; needs the CUDA build): every pick is a schedule
of the table (jaxgemm.kernels) that can run its problem, with a sane split; and the picks
do not move from the committed dump (tests/data/sm90_picks.json: the grid, and the problems
measured when a rule was made, MEASURED) unless someone measured the move: after such a
change, `python3 -P tests/test_heuristic.py` rewrites the dump, and the commit says what was
measured (tools/heuristic_picks.py diffs larger grids)."""

import itertools
import json
import os

import pytest

from jaxgemm import _ffi, kernels

pytestmark = pytest.mark.skipif(not _ffi.WITH_CUDA, reason="the heuristic is built with the CUDA kernels")

SMS = 132
SIZES = (16, 64, 96, 192, 320, 1000, 2048, 4096, 8192)
KS = (64, 256, 2048, 8192, 14336)
DUMP = os.path.join(os.path.dirname(__file__), "data", "sm90_picks.json")


def problems():
    """(m, n, k, batch, tf32, trans_a, trans_b, out_f32) over the grid; tf32 with B K-major
    only (trans_b), the one layout the kernel takes it in."""
    for m, n, k in itertools.product(SIZES, SIZES, KS):
        for ta, tb in itertools.product((False, True), repeat=2):
            yield m, n, k, 1, False, ta, tb, False
            yield m, n, k, 1, False, ta, tb, True
            if tb:
                yield m, n, k, 1, True, ta, tb, False
    for batch in (2, 16):
        yield 1024, 1000, 64, batch, False, False, False, False


def _p(m, n, k, batch=1, tf32=False, ta=False, tb=False, out_f32=False):
    return m, n, k, batch, tf32, ta, tb, out_f32


# Problems whose picks were measured when a rule of the cost model was made (bf16 on an
# H200 against XLA unless said; "old -> new" ratios are x XLA; NOTES.md has the rest). They
# join the grid in the dump, so a moved pick among them fails like any other.
MEASURED = [
    # Few rows stream B: the widest tile whose column tiles alone fill 3/4 of the SMs;
    # else 64 x 64, split within one wave, or shared stream-K where K allows (sessions 30-31).
    *(_p(m, n, k) for m in (1, 16, 64) for n, k in ((8192, 8192), (4096, 4096), (4096, 8192), (2048, 8192),
                                                    (4096, 2048), (2048, 4096), (3072, 4096), (3072, 8192),
                                                    (1536, 4096), (14336, 4096), (32768, 4096), (64, 1024))),
    *(_p(m, 4096, 4096, tf32=True) for m in (1, 16, 64)),  # tf32 shares no items: split (s23)
    *(_p(m, 4096, 4096, batch=2) for m in (1, 16, 64)),  # batches count as tiles
    _p(128, 8192, 8192), _p(256, 8192, 8192), _p(8192, 8192, 8192),
    # s32: clusters beat the pingpong by 2-6% beyond ~6 waves at K = 1024-2048; not in ~2-4.
    *(_p(m, n, 2048) for m, n in ((8192, 4096), (8192, 8192), (4096, 4096), (2048, 8192), (2048, 2048))),
    *(_p(m, n, 1024) for m, n in ((8192, 4096), (8192, 8192), (6144, 6144), (12288, 2048), (2048, 4096),
                                  (4096, 2048))),
    # s24: deep K with 1024 rows splits over 128-row tiles (0.64 -> 0.90); split partials cost
    # traffic (512 x 14336 x 4096 unsplit); 128 x 128 over many waves ~15% slower (3000 x 5000
    # x 7000: 0.47 -> 0.87); single waves keep narrow tiles.
    _p(1024, 1024, 32768), _p(512, 14336, 4096), _p(3000, 5000, 7000), _p(777, 1240, 4328), _p(256, 256, 65536),
    # s27: two consumers in a single wave (256 x 4096 x 14336 0.70 -> 0.96; 96 x 4096^2
    # 0.85 -> 0.95); tf32 keeps the one-consumer tile.
    _p(96, 4096, 4096), _p(256, 4096, 4096), _p(256, 4096, 14336), _p(256, 4096, 14336, tf32=True),
    _p(192, 4096, 14336, tf32=True),
    # s33: 129-192 and 321-384 rows on the 192 x 128 tile (192 x 6144 x 14336 0.51 -> 0.82,
    # 176 x 8192^2 0.53 -> 0.79); not at 193-320 rows, over two waves, or tf32.
    _p(192, 6144, 14336), _p(192, 12288, 14336), _p(176, 8192, 8192), _p(136, 4096, 14336),
    _p(384, 4096, 14336), _p(384, 16384, 1024),
    *(_p(m, 8192, 8192, tf32=t) for m in (129, 192, 321, 384) for t in (False, True)),
    *(_p(m, 8192, 8192) for m in (128, 193, 256, 320, 385, 1024)),
    # s34: 257-320 rows as D^T in 128 x 160 tiles (288 x 8192^2 0.48 -> 0.86); not for tf32,
    # A stored (k, m), short K or other row counts.
    *(_p(m, n, k, tf32=t, ta=a, out_f32=o) for m, n, k in ((288, 8192, 8192), (320, 8192, 8192), (272, 8192, 8192),
                                                           (257, 8192, 8192), (300, 14336, 4096), (320, 8192, 2048))
      for t, a, o in ((False, False, False), (True, False, False), (False, True, False), (False, False, True))),
    _p(288, 4096, 4096), _p(288, 16384, 1024), _p(288, 8192, 256), _p(192, 8192, 8192),
    # s35: K <= 128 is bound by writing the output, fastest on 192 x 128 (8192^2 x 64
    # 0.80 -> 0.97; attention's q k^T, B stored (n, k): 64 x 1024^2 x 64 0.81 -> 0.95); not at
    # K = 256, for tf32, under a wave of its items, or padding rows by over 1/8.
    *(_p(m, n, k, batch, tf32=t, ta=a, tb=tb) for m, n, k, batch, tb in (
        (8192, 8192, 64, 1, False), (16384, 4096, 64, 1, False), (8192, 8192, 32, 1, False),
        (8192, 8192, 128, 1, False), (2048, 2048, 64, 32, True), (1024, 1024, 64, 64, True),
        (512, 512, 64, 128, True), (4096, 4096, 128, 8, True))
      for t, a in ((False, False), (False, True), (True, False))),
    _p(4096, 4096, 256), _p(2048, 2048, 256, 8), _p(1024, 1024, 64), _p(640, 8192, 64, 4),
    # s36: float32 outputs of 16-bit inputs take the pingpong, which hides their epilogue
    # (4096^2 x 256 0.80 -> 0.85); 16-bit outputs, deep products and splits keep theirs; the
    # pingpong reads A stored (k, m) slowly; tf32 is float32 throughout.
    *(_p(m, n, k, batch, out_f32=o) for m, n, k, batch in (
        (8192, 8192, 64, 1), (4096, 4096, 64, 1), (4096, 4096, 256, 1), (8192, 8192, 1024, 1),
        (1024, 16384, 1024, 1), (1030, 1000, 64, 16), (4096, 4096, 4096, 1), (2048, 2048, 14336, 1))
      for o in (False, True)),
    _p(2048, 2048, 2048, ta=True, out_f32=True), _p(8192, 8192, 64, tf32=True, out_f32=True),
    _p(8192, 8192, 64, tf32=True),
    # s36: 768-3072 rows with deep K fill a wave with 192-row tiles (768 x 4096 x 8192
    # 0.83 -> 0.98); not padding rows by over 1/8 or over many waves.
    *(_p(m, n, k, ta=a) for m, n, k in ((768, 4096, 8192), (3072, 1024, 8192), (1536, 2048, 8192),
                                        (768, 4096, 14336), (700, 4100, 1000)) for a in (False, True)),
    _p(2048, 8192, 8192), _p(4096, 8192, 8192),
    # s28: K <= 4096 in a few waves on the pingpong, whose epilogues hide (2048^3 0.948 vs
    # 0.916); at K = 8192 and on the large squares the cooperative tiles; tf32 keeps its own.
    _p(4096, 2048, 1024), _p(3072, 2048, 2048), _p(2048, 2048, 8192), _p(4096, 4096, 4096), _p(16384, 4096, 14336),
    _p(2048, 2048, 2048, tf32=True),
    # s37: K <= 256 within two waves on the pingpong (2048^2 x 256 0.74 -> 0.87; batched
    # 64 x 256^3 0.84 -> 0.94); over many waves the cooperative tiles (8192 x 4096 x 256).
    *(_p(m, n, k, batch, ta=a, tb=b) for m, n, k, batch in (
        (1024, 4096, 256, 1), (2048, 2048, 256, 1), (512, 8192, 256, 1), (8192, 512, 256, 1), (256, 12288, 64, 1),
        (2048, 4096, 256, 1), (2048, 2048, 192, 1), (256, 256, 256, 64), (512, 512, 256, 16), (1024, 1024, 256, 8))
      for a, b in itertools.product((False, True), repeat=2)),
    _p(8192, 4096, 256), _p(8192, 8192, 256), _p(768, 12288, 256),
    # s29: the pingpong runs 1.115x as long with both operands MN-major, 1.04x with A alone
    # (2048^3 so stored 0.863 -> 0.936 on 128 x 256); the cooperative tiles do not care.
    *(_p(m, n, k, ta=a, tb=b) for m, n, k in ((2048, 2048, 2048), (1024, 8192, 2048), (512, 6144, 4096),
                                              (384, 6144, 8192)) for a, b in itertools.product((False, True), repeat=2)),
]


def key(problem) -> str:
    m, n, k, batch, tf32, ta, tb, out_f32 = problem
    layout = ("T" if ta else "N") + ("T" if tb else "N")
    return f"{m}x{n}x{k} b{batch} {layout}{' tf32' if tf32 else ''}{' f32out' if out_f32 else ''}"


def pick(problem):
    m, n, k, batch, tf32, ta, tb, out_f32 = problem
    tile_m, tile_n, split = _ffi.sm90_choice(m, n, k, batch, SMS, tf32, ta, tb, out_f32)
    return (tile_m, tile_n), split


def test_every_pick_is_a_schedule_that_runs_its_problem():
    schedules = {s.tile: s for s in kernels.SM90_SCHEDULES}
    problems_seen = 0
    for problem in problems():
        _, _, k, _, tf32, ta, _, _ = problem
        tile, split = pick(problem)
        s = schedules.get(tile)
        assert s is not None, (key(problem), tile)
        assert s.tf32 if tf32 else s.half, (key(problem), tile, "no instance for the inputs")
        assert not (tf32 and ta and s.pingpong), (key(problem), tile, "tf32 A from registers: no pingpong")
        assert not (s.swapped and (ta or tf32)), (key(problem), tile, "the swapped schedule takes 16-bit A (m, k)")
        assert 1 <= split <= max(1, k // 64), (key(problem), split)
        problems_seen += 1
    assert problems_seen > 1000


def dumped():
    """The dump's problems: the grid and the measured ones."""
    return {key(p): p for p in [*problems(), *MEASURED]}


def test_picks_are_those_of_the_committed_dump():
    """A moved pick is a performance change: measure it, then rewrite the dump."""
    with open(DUMP) as f:
        committed = json.load(f)
    now = {name: [*pick(p)[0], pick(p)[1]] for name, p in dumped().items()}
    assert now.keys() == committed.keys(), "the grid changed: rewrite the dump (see the module docstring)"
    moved = {k: (committed[k], v) for k, v in now.items() if v != committed[k]}
    assert not moved, f"{len(moved)} picks moved (committed, now), e.g. {dict(list(moved.items())[:8])}"


def test_tf32_picks_ignore_the_output_flag():
    """tf32 products are float32 throughout: asking with out_f32 changes nothing."""
    for m, n, k, batch, tf32, ta, tb, _ in problems():
        if tf32:
            assert _ffi.sm90_choice(m, n, k, batch, SMS, True, ta, tb, True) == _ffi.sm90_choice(
                m, n, k, batch, SMS, True, ta, tb, False), (m, n, k, ta, tb)


def test_few_row_grids():
    """Products of at most 64 rows split within one wave, or share each 64 x 64 item out
    stream-K on a grid of tiles x share blocks where K allows ranges of 2048 (and one slab,
    e.g. a fused epilogue, still gets the shared grid)."""
    for m in (1, 16, 64):
        assert _ffi.sm90_grid_sms(m, 8192, 8192, 1, SMS, 1) == 132
        assert _ffi.sm90_grid_sms(m, 4096, 4096, 1, SMS, 1) == 128  # 64 tiles by 2
        assert _ffi.sm90_grid_sms(m, 4096, 8192, 1, SMS, 2) == 132
        assert _ffi.sm90_grid_sms(m, 4096, 8192, 1, SMS, 1) == 128
        assert _ffi.sm90_grid_sms(m, 2048, 8192, 1, SMS, 1) == 128  # 32 tiles by 4
        assert _ffi.sm90_grid_sms(m, 2048, 4096, 1, SMS, 1) == 132  # too shallow to share
        assert _ffi.sm90_grid_sms(m, 3072, 4096, 1, SMS, 1) == 96  # 48 tiles by 2, within a wave


def test_few_rows_shared_wave_follows_the_stream_k_switch(monkeypatch):
    """The shared few-row wave needs stream-K's workspace, which the lowering allocates for
    the grid it was planned for; JAXGEMM_STREAM_K=0 (no workspace) brings the split back."""
    ws = _ffi.gemm_workspace_bytes(16, 4096, 4096, 1, SMS, 1, 0, 0, 0, False, False, False)
    assert ws == 128 * (64 * 64 * 4 + 4)  # a 64 x 64 fp32 slot and a flag per block of 128
    monkeypatch.setenv("JAXGEMM_STREAM_K", "0")
    assert _ffi.gemm_workspace_bytes(16, 4096, 4096, 1, SMS, 1, 0, 0, 0, False, False, False) == 0
    assert _ffi.gemm_workspace_bytes(8192, 8192, 8192, 1, SMS, 1, 0, 0, 0, False, False, False) == 0
    assert _ffi.sm90_choice(16, 4096, 4096, 1, SMS) == (64, 64, 2)
    assert _ffi.sm90_grid_sms(16, 4096, 4096, 1, SMS, 1) == 132


def test_fp8_products_writing_aux_take_the_pingpong_below_deep_k():
    """fp8.dense's forward (bias, gelu and z in the epilogue) ran faster on the pingpong
    128 x 128 than on the cooperative tiles at K = 1024 and 4096 (one H100, s61); without z,
    and at K = 14336, the cooperative tiles stay."""
    for m, n, k in ((32768, 4096, 1024), (32768, 1024, 4096), (8192, 4096, 2048)):
        assert _ffi.sm90_choice_fp8(m, n, k, SMS, True)[:2] == (128, 128), (m, n, k)
        assert _ffi.sm90_choice_fp8(m, n, k, SMS, False)[:2] != (128, 128), (m, n, k)
    assert _ffi.sm90_choice_fp8(16384, 4096, 14336, SMS, True)[1] == 256


def test_workspace_follows_the_output_type_the_kernel_writes():
    """Stream-K's workspace is sized for the pick of the output type the kernel writes
    (384 x 12288 x 4096: 128 x 256 tiles for bf16, the pingpong's for float32), and the
    lowering passes that type."""
    import jax.numpy as jnp

    from jaxgemm.gemm import KERNEL_FAMILIES, GemmConfig, _float_output

    def workspace(out_f32, kernel=0, tile=(0, 0)):
        return _ffi.gemm_workspace_bytes(384, 12288, 4096, 1, SMS, 1, kernel, *tile, False, False, False, out_f32)

    sm90 = KERNEL_FAMILIES["sm90"]
    assert workspace(True) == workspace(True, sm90, (128, 128)) > 0
    assert workspace(False) == workspace(False, sm90, (128, 256)) != workspace(True)
    assert _float_output(jnp.bfloat16, GemmConfig(out_dtype=jnp.dtype(jnp.float32)))
    assert not _float_output(jnp.bfloat16, GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16)))
    assert not _float_output(jnp.float32, GemmConfig(out_dtype=jnp.dtype(jnp.float32)))


if __name__ == "__main__":
    os.makedirs(os.path.dirname(DUMP), exist_ok=True)
    with open(DUMP, "w") as f:
        json.dump({name: [*pick(p)[0], pick(p)[1]] for name, p in dumped().items()}, f, indent=0)
    print(f"wrote {DUMP}")
