"""Times each sm90 tile schedule (forced) against XLA on a few bf16 shapes, in one process,
in alternating rounds (the order reverses every round: the GPU's clock follows its power):
    python3 -P tools/sm90_tile_sweep.py [M,N,K ...]   (on the GPU machine, jaxgemm installed)"""

import sys

import jax
import jax.numpy as jnp

from jaxgemm.bench import time_alternating_ms
from jaxgemm.gemm import GemmConfig, _gemm

SHAPES = [(8192, 8192, 8192), (4096, 8192, 4096), (4096, 4096, 4096), (2048, 2048, 2048), (16384, 4096, 14336)]
TILES = {"cluster 256x256": (256, 256), "coop 128x256": (128, 256), "pingpong 128x128": (128, 128)}


def main(shapes, rounds=4, per_round=15):
    print(f"{'M x N x K':>18} {'XLA TF/s':>9} " + " ".join(f"{name:>20}" for name in TILES))
    for m, n, k in shapes:
        ka, kb = jax.random.split(jax.random.key(0))
        a, b = jax.random.normal(ka, (m, k), jnp.bfloat16), jax.random.normal(kb, (k, n), jnp.bfloat16)
        flops = 2.0 * m * n * k
        runs = [("XLA", jax.jit(jnp.matmul))]
        for name, tile in TILES.items():
            config = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16), split_k=1, kernel="sm90", tile=tile)
            runs.append((name, jax.jit(lambda a, b, config=config: _gemm(a, b, config))))
        ms, _ = time_alternating_ms(dict(runs), (a, b), per_round, rounds)
        cells = [f"{flops / ms[name] / 1e9:7.1f} ({ms['XLA'] / ms[name]:.3f}x)" for name in TILES]
        print(f"{f'{m}x{n}x{k}':>18} {flops / ms['XLA'] / 1e9:9.1f} " + " ".join(f"{c:>20}" for c in cells), flush=True)


if __name__ == "__main__":
    main([tuple(map(int, s.split(","))) for s in sys.argv[1:]] or SHAPES)
