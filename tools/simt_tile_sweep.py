"""Times each SIMT float32 tile (forced, operands stored as the heuristic path stores large
ones: A as (K, M), B as (K, N)) and the heuristic's NN call against XLA's exact fp32
(precision="highest") in one process, in alternating rounds (the order reverses every
round: the GPU's clock follows its power):
    python3 -P tools/simt_tile_sweep.py [M,N,K ...]   (on the GPU machine, jaxgemm installed)"""

import sys

import jax
import jax.numpy as jnp

import jaxgemm
from jaxgemm.bench import time_alternating_ms
from jaxgemm.gemm import GemmConfig, gemm_product

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 1024), (4096, 4096, 1024), (4095, 4097, 4093),
          (128, 8192, 8192)]
TILES = {"256x128": (256, 128), "128x128": (128, 128)}


def main(shapes, rounds=4, per_round=10):
    names = list(TILES) + ["heuristic NN"]
    print(f"{'M x N x K':>18} {'XLA TF/s':>9} " + " ".join(f"{name:>18}" for name in names))
    for m, n, k in shapes:
        ka, kb = jax.random.split(jax.random.key(0))
        a, b = jax.random.normal(ka, (m, k), jnp.float32), jax.random.normal(kb, (k, n), jnp.float32)
        a_t = a.T.copy()
        flops = 2.0 * m * n * k
        runs = [("XLA", jax.jit(lambda a, a_t, b: jnp.dot(a, b, precision="highest")))]
        for name, tile in TILES.items():
            config = GemmConfig(transpose_a=True, split_k=1, kernel="simt", tile=tile)
            runs.append((name, jax.jit(lambda a, a_t, b, config=config: gemm_product(a_t, b, config))))
        runs.append(("heuristic NN", jax.jit(lambda a, a_t, b: jaxgemm.matmul(a, b))))
        ms, _ = time_alternating_ms(dict(runs), (a, a_t, b), per_round, rounds)
        cells = [f"{flops / ms[name] / 1e9:6.1f} ({ms['XLA'] / ms[name]:.3f}x)" for name in names]
        print(f"{f'{m}x{n}x{k}':>18} {flops / ms['XLA'] / 1e9:9.1f} " + " ".join(f"{c:>18}" for c in cells), flush=True)


if __name__ == "__main__":
    main([tuple(map(int, s.split(","))) for s in sys.argv[1:]] or SHAPES)
