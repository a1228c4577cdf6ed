"""Opt-in autotuner for the CUDA GEMM kernels.

With ``JAXGEMM_AUTOTUNE=1``, the first `jaxgemm.matmul` of a problem (device, dtype,
layout, batch, M x N x K) times every kernel configuration that can run it (kernel family,
tile, split-K) on random inputs of that shape and keeps the fastest. Choices are cached in
memory and in a JSON file (``JAXGEMM_AUTOTUNE_CACHE``, default
``~/.cache/jaxgemm/autotune.json``), so later processes reuse them. Unset or ``0``: the
handler's heuristic picks, nothing is timed.

Tuning happens at trace time, outside the traced computation; it costs a few compilations
and timed runs per new problem.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Callable

import jax
import jax.numpy as jnp

from jaxgemm import kernels

ENV_ENABLE = "JAXGEMM_AUTOTUNE"
ENV_CACHE = "JAXGEMM_AUTOTUNE_CACHE"

_lock = threading.Lock()
_memory: dict[str, dict] = {}
_loaded_from: str | None = None


def enabled() -> bool:
    return os.environ.get(ENV_ENABLE, "0") not in ("", "0", "false", "False")


def cache_path() -> str:
    return os.environ.get(ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "jaxgemm", "autotune.json")


def problem_key(device: str, dtype, transpose_a: bool, transpose_b: bool, batch: int, m: int, n: int, k: int,
                tf32: bool = False) -> str:
    layout = ("T" if transpose_a else "N") + ("T" if transpose_b else "N")
    name = "tf32" if tf32 and jnp.dtype(dtype) == jnp.float32 else jnp.dtype(dtype).name
    return f"{device}|{name}|{layout}|b{batch}|{m}x{n}x{k}"


def candidates(dtype, compute_capability: int, tf32: bool = False) -> list[dict]:
    """GemmConfig overrides worth timing for a dtype on a device (split_k None: the
    lowering's heuristic split). `tf32`: float32 that may run as tf32."""
    # (Every schedule built for the dtype; one that cannot take the problem's layout fails,
    # and tuning skips it.)
    sm90 = [("sm90", t) for t in kernels.sm90_tiles(dtype)] if compute_capability == 90 else []
    if jnp.dtype(dtype) == jnp.float32:
        tiles = [("simt", t) for t in kernels.SIMT_HEURISTIC_TILES]
        if tf32:
            tiles = sm90 + tiles
    else:
        tiles = sm90 + [("sm80", None)]
    return [
        {"kernel": kernel, "tile": tile, "split_k": split}
        for kernel, tile in tiles
        for split in (None, 1, 2, 4)
    ]


def _load() -> None:
    global _loaded_from
    path = cache_path()
    if _loaded_from == path:
        return
    _loaded_from = path
    try:
        with open(path) as f:
            stored = json.load(f)
    except (OSError, ValueError):
        return
    if isinstance(stored, dict):
        for key, choice in stored.items():
            if isinstance(choice, dict):
                _memory.setdefault(key, choice)


def _save() -> None:
    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(_memory, f, indent=1, sort_keys=True)
        os.replace(tmp, path)  # atomic: concurrent processes never read half a file
    except OSError:
        pass  # an unwritable cache only costs re-tuning in the next process


def choose(key: str, options: list[dict], time_ms: Callable[[dict], float]) -> dict:
    """The cached choice for `key`, or the fastest of `options` by `time_ms` (which raises
    for a configuration that cannot run), cached in memory and on disk."""
    with _lock:
        _load()
        if key in _memory:
            return _memory[key]
        timed = []
        for option in options:
            try:
                timed.append((time_ms(option), option))
            except Exception:
                continue
        if not timed:
            raise RuntimeError(f"jaxgemm autotune: no candidate ran for {key}")
        best_ms, best = min(timed, key=lambda t: t[0])
        _memory[key] = {**best, "ms": best_ms}
        _save()
        return _memory[key]


def clear_memory() -> None:
    """Forgets in-memory choices (the JSON file is re-read on next use)."""
    global _loaded_from
    with _lock:
        _memory.clear()
        _loaded_from = None


def tuned_config(config, a_shape, b_shape, dtype, batch: int):
    """`config` with the autotuned kernel, tile and split-K for this problem on the default
    GPU; unchanged when tuning is off, on a CPU, or for rows the kernels cannot take as
    they are (the lowering then pads, with the heuristic's choice)."""
    from jaxgemm import _ffi
    from jaxgemm.gemm import gemm_product, gemm_dims

    if not enabled() or jax.default_backend() != "gpu" or not _ffi.WITH_CUDA:
        return config
    if config.kernel is not None or config.split_k is not None:
        return config  # an explicit request wins
    if jnp.dtype(dtype) != jnp.float32 and (a_shape[-1] % 8 or b_shape[-1] % 8):
        return config
    from jaxgemm.bench import time_ms  # (the benchmarks' timer: imported only to tune)

    m, k, n, _ = gemm_dims(a_shape, b_shape, config)
    device = jax.devices()[0].device_kind
    key = problem_key(device, dtype, config.transpose_a, config.transpose_b, batch, m, n, k, config.tf32)
    keys = jax.random.split(jax.random.key(0))
    a = jax.random.normal(keys[0], a_shape, dtype)
    b = jax.random.normal(keys[1], b_shape, dtype)

    def time_option(option: dict) -> float:
        trial = dataclasses.replace(config, kernel=option["kernel"], tile=_tile(option), split_k=option["split_k"])
        fn = jax.jit(lambda a, b: gemm_product(a, b, trial))
        jax.block_until_ready(fn(a, b))  # compiles, and raises if the kernel cannot run
        return time_ms(fn, (a, b), 10)[0]

    choice = choose(key, candidates(dtype, _ffi.cuda_compute_capability(), config.tf32), time_option)
    return dataclasses.replace(config, kernel=choice["kernel"], tile=_tile(choice), split_k=choice["split_k"])


def _tile(option: dict):
    return tuple(option["tile"]) if option.get("tile") else None
