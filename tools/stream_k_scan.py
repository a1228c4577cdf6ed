"""Stream-K on vs off (JAXGEMM_STREAM_K=0 when lowering), the heuristic's sm90 schedule,
bf16, alternating rounds in one process; `waves` counts 128 x 256 tiles over 132 SMs
(stream-K shares out a last wave at most ~55% full):
python tools/stream_k_scan.py [M,N,K ...]"""

import os
import sys

import jax
import jax.numpy as jnp

from jaxgemm.bench import time_pair_ms
from jaxgemm.gemm import GemmConfig, _gemm

DEFAULT = [(8192, 8192, 8192), (4096, 4096, 4096), (4096, 8192, 4096), (16384, 4096, 14336), (6144, 6144, 6144),
           (8192, 8192, 4096), (8192, 8192, 16384), (3072, 8192, 8192), (5120, 5120, 5120), (2048, 8192, 8192)]


def lowered(a, b, stream_k):
    os.environ["JAXGEMM_STREAM_K"] = "1" if stream_k else "0"
    config = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16))
    fn = jax.jit(lambda a, b: _gemm(a, b, config)).lower(a, b).compile()
    os.environ.pop("JAXGEMM_STREAM_K")
    return fn


def main(shapes):
    for m, n, k in shapes:
        ka, kb = jax.random.split(jax.random.key(m + n + k))
        a = jax.random.normal(ka, (m, k), jnp.bfloat16)
        b = jax.random.normal(kb, (k, n), jnp.bfloat16)
        on, off = lowered(a, b, True), lowered(a, b, False)
        t_on, t_off, _ = time_pair_ms(on, off, (a, b), 40)
        waves = (-(-m // 128)) * (-(-n // 256)) / 132
        print(f"{m}x{n}x{k}: waves {waves:5.2f}  stream-K {t_on:.4f} ms  whole tiles {t_off:.4f} ms"
              f"  off/on {t_off / t_on:.3f}", flush=True)


if __name__ == "__main__":
    main([tuple(map(int, s.split(","))) for s in sys.argv[1:]] or DEFAULT)
