"""Per-kernel CUPTI times (median over iterations) of XLA's and jaxgemm's GEMMs with few
rows, beside a pure read of B (the bandwidth floor), to see where a call's time goes:
python tools/kernel_breakdown.py [M[,N,K] ...]   (default 16 64 128; N = K = 8192; bf16)."""

import dataclasses
import statistics
import sys

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler

from jaxgemm.gemm import GemmConfig, gemm_product


def breakdown(fn, args, iterations=50):
    """[(kernel name, median ms)] for one call of fn, kernels in launch order."""
    _, per_iter = profiler.measure(jax.jit(fn), aggregate=False, iterations=iterations)(*args)
    names = [name for name, _ in per_iter[0]]
    return [(name, statistics.median(it[i][1] for it in per_iter)) for i, name in enumerate(names)]


def show(label, rows):
    total = sum(ms for _, ms in rows)
    print(f"  {label:<24} {total * 1e3:7.1f} us = " +
          " + ".join(f"{ms * 1e3:.1f} [{name[:48]}]" for name, ms in rows))
    return total


def main(shapes):
    for m, n, k in shapes:
        ka, kb = jax.random.split(jax.random.key(m))
        a = jax.random.normal(ka, (m, k), jnp.bfloat16)
        b = jax.random.normal(kb, (k, n), jnp.bfloat16)
        print(f"bf16 M={m} N={n} K={k} (B: {b.nbytes / 2**20:.0f} MiB)")
        read = show("read B (column sums)", breakdown(lambda b: jnp.sum(b, axis=0, dtype=jnp.float32), (b,)))
        print(f"  {'':<24} = {b.nbytes / read / 1e9:.2f} TB/s")
        xla = show("XLA", breakdown(jnp.matmul, (a, b)))
        base = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16))
        configs = [("heuristic", base)] + [
            (f"{t[0]}x{t[1]} split {s}", dataclasses.replace(base, kernel="sm90", tile=t, split_k=s))
            for t, s in (((64, 64), 1), ((64, 64), 2), ((64, 64), 4), ((64, 128), 1), ((64, 128), 2), ((128, 64), 1),
                         ((128, 64), 2), ((128, 128), 1))]
        for label, config in configs:
            t = show(label, breakdown(lambda a, b, config=config: gemm_product(a, b, config), (a, b)))
            print(f"  {'':<24} XLA/ours {xla / t:.3f}, B at {b.nbytes / t / 1e9:.2f} TB/s")


if __name__ == "__main__":
    shapes = [tuple(map(int, arg.split(","))) for arg in sys.argv[1:]] or [(16,), (64,), (128,)]
    main([s if len(s) == 3 else (s[0], 8192, 8192) for s in shapes])
