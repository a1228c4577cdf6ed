"""Benchmarks of jaxgemm against XLA, and the timing helpers they and tools/ share.

    python -m jaxgemm.bench [--suite simt,tc,epilogue,smoke,all]   GEMM suites (gemm.py)
    python -m jaxgemm.bench.conv                                   conv2d on ResNet-50's layers
    python -m jaxgemm.bench.ragged                                 ragged_dot on mixture-of-experts shapes

Not imported by `import jaxgemm`. Kernel time comes from CUPTI
(`jax.experimental.mosaic.gpu.profiler.measure`): the sum of the kernels one call
launches. Without CUPTI (e.g. on a CPU) the median wall-clock time of a jitted call is used,
and the method returned says so.
"""

from __future__ import annotations

import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def _cupti_timer():
    try:
        from jax.experimental.mosaic.gpu import profiler

        if jax.default_backend() != "gpu":
            return None
        return profiler.measure
    except Exception:  # noqa: BLE001 - any import problem means no CUPTI here
        return None


def time_samples(fn, args, iterations: int) -> tuple[list[float], str]:
    """Per-call times in ms over `iterations` calls, and the method used ('cupti' or 'wall')."""
    measure = _cupti_timer()
    if measure is not None:
        try:
            _, times = measure(fn, iterations=iterations)(*args)
        except Exception as e:  # noqa: BLE001 - fall back to wall-clock, say so
            print(f"\nCUPTI timing failed ({e!r}); using wall-clock time", file=sys.stderr)
            times = None
        if times:
            return [float(t) for t in (times if isinstance(times, list) else [times])], "cupti"
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples, "wall"


def time_ms(fn, args, iterations: int) -> tuple[float, str]:
    """Median per-call time in ms, and the method used ('cupti' or 'wall')."""
    samples, method = time_samples(fn, args, iterations)
    return float(statistics.median(samples)), method


def time_alternating_ms(fns: dict, args, per_round: int, rounds: int = 4) -> tuple[dict, str]:
    """Median per-call times (ms) of several functions on the same inputs, measured in
    `rounds` rounds of `per_round` calls each, the order reversed every round: the GPU's
    clock follows its power and temperature, so timing one function entirely before another
    biases their ratio."""
    runs = list(fns.items())
    samples = {name: [] for name, _ in runs}
    method = "wall"
    for r in range(rounds):
        for name, fn in runs if r % 2 == 0 else runs[::-1]:
            times, method = time_samples(fn, args, per_round)
            samples[name].extend(times)
    return {name: float(statistics.median(v)) for name, v in samples.items()}, method


def time_pair_ms(ours, base, args, iterations: int, rounds: int = 4) -> tuple[float, float, str]:
    """Median times of two functions on the same inputs, in alternating rounds of
    iterations // 2 calls each (time_alternating_ms)."""
    ms, method = time_alternating_ms({"ours": ours, "base": base}, args, max(1, iterations // 2), rounds)
    return ms["ours"], ms["base"], method


def rel_error(x, ref) -> float:
    """Relative Frobenius error of x against ref, computed in float64."""
    x = np.asarray(jnp.asarray(x, jnp.float32), np.float64)
    ref = np.asarray(jnp.asarray(ref, jnp.float32), np.float64)
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))
