"""Times matmul + bias + gelu + aux on each sm90 tile schedule (forced) against the plain
matmul on the heuristic's schedule, bf16, one process:
    python3 -P tools/fused_tile_sweep.py   (on the GPU machine, jaxgemm installed)"""

import jax
import jax.numpy as jnp

from jaxgemm.bench import time_ms
from jaxgemm.epilogue import EpilogueConfig, fused_matmul
from jaxgemm.gemm import GemmConfig, gemm_product

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096)]
TILES = {"cluster 256x256": (256, 256), "coop 128x256": (128, 256), "pingpong 128x128": (128, 128)}
EPI = EpilogueConfig(activation="gelu", want_aux=True)

print(f"{'M x N x K':>16} {'plain ms':>9} " + " ".join(f"{name:>22}" for name in TILES) + "   (fused ms, fused/plain)")
for m, n, k in SHAPES:
    ka, kb, kc = jax.random.split(jax.random.key(0), 3)
    a, b = jax.random.normal(ka, (m, k), jnp.bfloat16), jax.random.normal(kb, (k, n), jnp.bfloat16)
    bias = jax.random.normal(kc, (n,), jnp.bfloat16)
    base = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16), split_k=1)
    plain_ms, _ = time_ms(jax.jit(lambda a, b: gemm_product(a, b, base)), (a, b), 30)
    cells = []
    for tile in TILES.values():
        config = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16), split_k=1, kernel="sm90", tile=tile)
        fused = jax.jit(lambda a, b, bias, config=config: fused_matmul(a, b, None, bias, None, config, EPI))
        ms, _ = time_ms(fused, (a, b, bias), 30)
        cells.append(f"{ms:8.3f} ({ms / plain_ms:.3f}x)")
    print(f"{f'{m}x{n}x{k}':>16} {plain_ms:9.3f} " + " ".join(f"{c:>22}" for c in cells))
