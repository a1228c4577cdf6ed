"""The opt-in autotuner's choice and cache logic (jaxgemm/autotune.py), with a fake timer;
on a GPU, one real tuning through jaxgemm.matmul."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import TOLERANCE, random, rel_error, to64

import jaxgemm
from jaxgemm import autotune, kernels


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "autotune.json"
    monkeypatch.setenv(autotune.ENV_CACHE, str(path))
    autotune.clear_memory()
    yield path
    autotune.clear_memory()


def test_choose_picks_the_fastest_that_runs_and_caches_it(cache):
    options = [{"kernel": "a", "tile": None, "split_k": 1}, {"kernel": "b", "tile": [1, 2], "split_k": 2},
               {"kernel": "c", "tile": None, "split_k": None}]
    times = {"a": 3.0, "b": 1.0}
    calls = []

    def fake(option):
        calls.append(option["kernel"])
        if option["kernel"] not in times:
            raise ValueError("cannot run")
        return times[option["kernel"]]

    choice = autotune.choose("k1", options, fake)
    assert choice["kernel"] == "b" and choice["ms"] == 1.0
    assert calls == ["a", "b", "c"]
    # Cached in memory: no more timing.
    assert autotune.choose("k1", options, lambda o: pytest.fail("timed again"))["kernel"] == "b"
    # And on disk: a fresh process (memory cleared) reads it back.
    assert json.loads(cache.read_text())["k1"]["kernel"] == "b"
    autotune.clear_memory()
    assert autotune.choose("k1", options, lambda o: pytest.fail("timed again"))["tile"] == [1, 2]


def test_choose_with_no_runnable_candidate_is_an_error(cache):
    with pytest.raises(RuntimeError, match="no candidate ran"):
        autotune.choose("k2", [{"kernel": "a"}], lambda o: (_ for _ in ()).throw(ValueError("no")))


def test_unreadable_cache_file_is_ignored(cache):
    cache.write_text("{not json")
    assert autotune.choose("k3", [{"kernel": "a"}], lambda o: 2.0)["kernel"] == "a"
    assert json.loads(cache.read_text())["k3"]["ms"] == 2.0


def test_disabled_or_cpu_leaves_the_config_alone(cache, monkeypatch):
    from jaxgemm.gemm import GemmConfig

    config = GemmConfig()
    monkeypatch.setenv(autotune.ENV_ENABLE, "0")
    assert autotune.tuned_config(config, (8, 8), (8, 8), jnp.float32, 1) is config
    if jax.default_backend() != "gpu":
        monkeypatch.setenv(autotune.ENV_ENABLE, "1")
        assert autotune.tuned_config(config, (8, 8), (8, 8), jnp.float32, 1) is config


def test_candidates_cover_the_kernel_families():
    assert {c["kernel"] for c in autotune.candidates(jnp.bfloat16, 90)} == {"sm90", "sm80"}
    assert {c["kernel"] for c in autotune.candidates(jnp.bfloat16, 80)} == {"sm80"}
    assert {c["kernel"] for c in autotune.candidates(jnp.float32, 90)} == {"simt"}
    assert {c["kernel"] for c in autotune.candidates(jnp.float32, 90, tf32=True)} == {"sm90", "simt"}
    assert {c["kernel"] for c in autotune.candidates(jnp.float32, 80, tf32=True)} == {"simt"}
    # Every sm90 schedule for 16-bit inputs; for tf32 those built for it (not the
    # three-consumer 192 x 128 nor the swapped 160 x 128).
    # The SIMT tiles the heuristic weighs, from the C++ table (128 x 128 its default; the
    # 256 x 128 tile runs only when asked for).
    tiles_simt = {c["tile"] for c in autotune.candidates(jnp.float32, 90)}
    assert tiles_simt == set(kernels.SIMT_HEURISTIC_TILES) == {(128, 128), (128, 64), (64, 64)}
    assert kernels.SIMT_HEURISTIC_TILES[0] == (128, 128) and (256, 128) in kernels.SIMT_TILES
    tiles_16 = {c["tile"] for c in autotune.candidates(jnp.bfloat16, 90) if c["kernel"] == "sm90"}
    tiles_tf32 = {c["tile"] for c in autotune.candidates(jnp.float32, 90, tf32=True) if c["kernel"] == "sm90"}
    assert tiles_16 == {s.tile for s in kernels.SM90_SCHEDULES if s.half}
    assert tiles_tf32 == {s.tile for s in kernels.SM90_SCHEDULES if s.tf32}
    assert (192, 128) in tiles_16 - tiles_tf32 and (160, 128) in tiles_16 - tiles_tf32
    assert autotune.problem_key("H", jnp.float32, False, False, 1, 2, 3, 4, tf32=True) != autotune.problem_key(
        "H", jnp.float32, False, False, 1, 2, 3, 4)


@pytest.mark.gpu
def test_gpu_autotuned_matmul_is_correct_and_cached(cache, monkeypatch):
    monkeypatch.setenv(autotune.ENV_ENABLE, "1")
    rng = np.random.default_rng(20)
    for dtype in (jnp.bfloat16, jnp.float32):
        a, b = random(rng, (384, 264), dtype), random(rng, (264, 520), dtype)
        out = jaxgemm.matmul(a, b)
        assert rel_error(out, np.matmul(to64(a), to64(b))) <= TOLERANCE[jnp.dtype(dtype)]
    stored = json.loads(cache.read_text())
    assert len(stored) == 2 and all("ms" in v for v in stored.values())
