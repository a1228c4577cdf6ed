"""Times each sm90 tile schedule (forced) against XLA on a few bf16 shapes, one process:
    python3 -P tools/sm90_tile_sweep.py   (on the GPU machine, jaxgemm installed)"""

import jax
import jax.numpy as jnp

from jaxgemm.bench import time_ms
from jaxgemm.gemm import GemmConfig, _gemm

SHAPES = [(8192, 8192, 8192), (4096, 8192, 4096), (4096, 4096, 4096), (2048, 2048, 2048), (16384, 4096, 14336)]
TILES = {"cluster 256x256": (256, 256), "coop 128x256": (128, 256), "pingpong 128x128": (128, 128)}

print(f"{'M x N x K':>18} {'XLA TF/s':>9} " + " ".join(f"{name:>17}" for name in TILES))
for m, n, k in SHAPES:
    ka, kb = jax.random.split(jax.random.key(0))
    a, b = jax.random.normal(ka, (m, k), jnp.bfloat16), jax.random.normal(kb, (k, n), jnp.bfloat16)
    flops = 2.0 * m * n * k
    xla_ms, _ = time_ms(jax.jit(jnp.matmul), (a, b), 30)
    cells = []
    for tile in TILES.values():
        config = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16), split_k=1, kernel="sm90", tile=tile)
        ms, _ = time_ms(jax.jit(lambda a, b, config=config: _gemm(a, b, config)), (a, b), 30)
        cells.append(f"{flops / ms / 1e9:7.1f} ({xla_ms / ms:.3f}x)")
    print(f"{f'{m}x{n}x{k}':>18} {flops / xla_ms / 1e9:9.1f} " + " ".join(f"{c:>17}" for c in cells))
