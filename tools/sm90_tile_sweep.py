"""Times each sm90 tile schedule (forced) and the heuristic's choice against XLA on a few
bf16 shapes, in one process, in alternating rounds (the order reverses every round: the
GPU's clock follows its power):
    python3 -P tools/sm90_tile_sweep.py [--tiles 256x256,128x256,128x128,64x128/4 ...] [M,N,K ...]
(on the GPU machine, jaxgemm installed). A tile's "/S" suffix forces split-K S (default 1)."""

import argparse

import jax
import jax.numpy as jnp

from jaxgemm.bench import time_alternating_ms
from jaxgemm.gemm import GemmConfig, _gemm

SHAPES = [(8192, 8192, 8192), (4096, 8192, 4096), (4096, 4096, 4096), (2048, 2048, 2048), (16384, 4096, 14336)]
DEFAULT_TILES = "256x256,128x256,128x128"


def main(shapes, tiles, rounds=4, per_round=15):
    names = ["heuristic"] + tiles
    print(f"{'M x N x K':>18} {'XLA TF/s':>9} " + " ".join(f"{name:>18}" for name in names))
    for m, n, k in shapes:
        ka, kb = jax.random.split(jax.random.key(0))
        a, b = jax.random.normal(ka, (m, k), jnp.bfloat16), jax.random.normal(kb, (k, n), jnp.bfloat16)
        flops = 2.0 * m * n * k
        base = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16))
        runs = {"XLA": jax.jit(jnp.matmul), "heuristic": jax.jit(lambda a, b: _gemm(a, b, base))}
        for name in tiles:
            shape, _, split = name.partition("/")
            tile = tuple(map(int, shape.split("x")))
            config = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16), split_k=int(split or 1), kernel="sm90", tile=tile)
            runs[name] = jax.jit(lambda a, b, config=config: _gemm(a, b, config))
        ms, _ = time_alternating_ms(runs, (a, b), per_round, rounds)
        cells = [f"{flops / ms[name] / 1e9:6.1f} ({ms['XLA'] / ms[name]:.3f}x)" for name in names]
        print(f"{f'{m}x{n}x{k}':>18} {flops / ms['XLA'] / 1e9:9.1f} " + " ".join(f"{c:>18}" for c in cells), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiles", default=DEFAULT_TILES, help="comma-separated MxN[/split]")
    parser.add_argument("shapes", nargs="*", help="M,N,K")
    args = parser.parse_args()
    main([tuple(map(int, s.split(","))) for s in args.shapes] or SHAPES, args.tiles.split(","))
