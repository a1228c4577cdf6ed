"""Properties of the Hopper heuristic's picks (ffi_src/gemm/sm90/heuristic.cu) over a grid
of problems, computed on the host (no GPU; needs the CUDA build): every pick is a schedule
of the table (jaxgemm.kernels) that can run its problem, with a sane split; and the picks
do not move from the committed dump (tests/data/sm90_picks.json) unless someone measured
the move: after such a change, `python3 -P tests/test_heuristic.py` rewrites the dump, and
the commit says what was measured (tools/heuristic_picks.py diffs larger grids)."""

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
        assert s.tf32 or not tf32, (key(problem), tile, "no tf32 instance")
        assert not (tf32 and ta and s.pingpong), (key(problem), tile, "tf32 A from registers: no pingpong")
        assert not (s.swapped and (ta or tf32)), (key(problem), tile, "the swapped schedule takes 16-bit A (m, k)")
        assert 1 <= split <= max(1, k // 64), (key(problem), split)
        problems_seen += 1
    assert problems_seen > 1000


def test_picks_are_those_of_the_committed_dump():
    """A moved pick is a performance change: measure it, then rewrite the dump."""
    with open(DUMP) as f:
        committed = json.load(f)
    now = {key(p): [*pick(p)[0], pick(p)[1]] for p in problems()}
    assert now.keys() == committed.keys(), "the grid changed: rewrite the dump (see the module docstring)"
    moved = {k: (committed[k], v) for k, v in now.items() if v != committed[k]}
    assert not moved, f"{len(moved)} picks moved (committed, now), e.g. {dict(list(moved.items())[:8])}"


if __name__ == "__main__":
    os.makedirs(os.path.dirname(DUMP), exist_ok=True)
    with open(DUMP, "w") as f:
        json.dump({key(p): [*pick(p)[0], pick(p)[1]] for p in problems()}, f, indent=0)
    print(f"wrote {DUMP}")
