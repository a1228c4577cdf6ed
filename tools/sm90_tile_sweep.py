"""Times each sm90 tile schedule (forced) and the heuristic's choice against XLA on a few
bf16 shapes, in one process, in alternating rounds (the order reverses every round: the
GPU's clock follows its power):
    python3 -P tools/sm90_tile_sweep.py [--tiles 256x256,128x256,128x128,64x128/4 ...] [M,N,K[,B][:NT] ...]
(on the GPU machine, jaxgemm installed). A tile's "/S" suffix forces split-K S (default 1); a
shape's fourth number is a batch dimension of both operands, and a layout suffix says which
operands are stored transposed (NT: B stored (n, k), as q @ k^T in attention)."""

import argparse
import dataclasses

import jax
import jax.numpy as jnp

from jaxgemm.bench import time_alternating_ms
from jaxgemm.gemm import GemmConfig, gemm_product

SHAPES = [(8192, 8192, 8192), (4096, 8192, 4096), (4096, 4096, 4096), (2048, 2048, 2048), (16384, 4096, 14336)]
DEFAULT_TILES = "256x256,128x256,128x128"


def main(shapes, tiles, out_dtype="bfloat16", rounds=4, per_round=15):
    names = ["heuristic"] + tiles
    print(f"{'[B x] M x N x K':>22} {'XLA TF/s':>9} " + " ".join(f"{name:>18}" for name in names))
    for (m, n, k, *batch), layout in shapes:
        ta, tb = layout[0] == "T", layout[1] == "T"
        ka, kb = jax.random.split(jax.random.key(0))
        a = jax.random.normal(ka, (*batch, *((k, m) if ta else (m, k))), jnp.bfloat16)
        b = jax.random.normal(kb, (*batch, *((n, k) if tb else (k, n))), jnp.bfloat16)
        flops = 2.0 * m * n * k * (batch[0] if batch else 1)
        base = GemmConfig(out_dtype=jnp.dtype(out_dtype), transpose_a=ta, transpose_b=tb)
        xla = lambda a, b: jnp.matmul(a.mT if ta else a, b.mT if tb else b, preferred_element_type=out_dtype)
        runs = {"XLA": jax.jit(xla), "heuristic": jax.jit(lambda a, b: gemm_product(a, b, base))}
        for name in tiles:
            shape, _, split = name.partition("/")
            tile = tuple(map(int, shape.split("x")))
            config = dataclasses.replace(base, split_k=int(split or 1), kernel="sm90", tile=tile)
            run = jax.jit(lambda a, b, config=config: gemm_product(a, b, config))
            try:  # a forced tile the kernel refuses (e.g. rows off 16 bytes) is left out, not fatal
                jax.block_until_ready(run(a, b))
                runs[name] = run
            except Exception as e:  # noqa: BLE001 (XLA's runtime error type differs by version)
                print(f"  {name}: {str(e).splitlines()[0][:100]}", flush=True)
        ms, _ = time_alternating_ms(runs, (a, b), per_round, rounds)
        cells = [f"{flops / ms[name] / 1e9:6.1f} ({ms['XLA'] / ms[name]:.3f}x)" if name in ms else "n/a"
                 for name in names]
        label = "x".join(map(str, (*batch, m, n, k))) + ("" if layout == "NN" else f" {layout}")
        print(f"{label:>22} {flops / ms['XLA'] / 1e9:9.1f} " + " ".join(f"{c:>18}" for c in cells), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiles", default=DEFAULT_TILES, help="comma-separated MxN[/split]")
    parser.add_argument("--out-dtype", default="bfloat16", help="the product's dtype (bf16 inputs)")
    parser.add_argument("shapes", nargs="*", help="M,N,K[,B][:layout]")
    args = parser.parse_args()
    shapes = [(tuple(map(int, dims.split(","))), (layout or ["NN"])[0])
              for dims, *layout in (s.split(":") for s in args.shapes)]
    main(shapes or [(s, "NN") for s in SHAPES], args.tiles.split(","), args.out_dtype)
