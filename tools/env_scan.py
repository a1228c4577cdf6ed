"""Times the heuristic's bf16 GEMM under each value of one jaxgemm environment variable
that the kernels read when they launch (e.g. JAXGEMM_SM_COUNT: plan the grid for fewer
SMs), against XLA, in alternating rounds in one process:
    python tools/env_scan.py [--fused] JAXGEMM_SM_COUNT=132,128 [M,N,K ...]
--fused: ours with bias + gelu + aux (XLA stays the plain product)."""

import os
import statistics
import sys

import jax
import jax.numpy as jnp

import jaxgemm
from jaxgemm.bench import time_samples
from jaxgemm.gemm import GemmConfig, gemm_product

DEFAULT = [(8192, 8192, 8192), (16384, 4096, 14336), (4096, 8192, 4096), (4096, 4096, 4096), (2048, 2048, 2048)]


def main(var, values, shapes, fused=False, rounds=4, per_round=20):
    config = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16))
    for m, n, k in shapes:
        ka, kb, kc = jax.random.split(jax.random.key(m + n + k), 3)
        a = jax.random.normal(ka, (m, k), jnp.bfloat16)
        b = jax.random.normal(kb, (k, n), jnp.bfloat16)
        if fused:
            bias = jax.random.normal(kc, (n,), jnp.bfloat16)  # as bench's bias+gelu+aux case
            ours = jax.jit(lambda a, b: jaxgemm.matmul(a, b, bias=bias, activation="gelu", return_pre_activation=True))
        else:
            ours = jax.jit(lambda a, b: gemm_product(a, b, config))
        xla = jax.jit(lambda a, b: a @ b)
        runs = [(v, ours) for v in values] + [(None, xla)]
        samples = {v: [] for v, _ in runs}
        for r in range(rounds):
            for value, fn in runs if r % 2 == 0 else runs[::-1]:
                if value is not None:
                    os.environ[var] = value
                samples[value].extend(time_samples(fn, (a, b), per_round)[0])
                os.environ.pop(var, None)
        xla_ms = statistics.median(samples[None])
        cells = "  ".join(f"{var}={v} {statistics.median(samples[v]):.4f} ms ({xla_ms / statistics.median(samples[v]):.3f}x)"
                          for v in values)
        print(f"{m}x{n}x{k}: XLA {xla_ms:.4f} ms  {cells}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    fused = "--fused" in args
    args = [a for a in args if a != "--fused"]
    var, values = args[0].split("=")
    main(var, values.split(","), [tuple(map(int, s.split(","))) for s in args[1:]] or DEFAULT, fused)
