"""What each part of the fused epilogue costs: bf16 matmul with bias, gelu and the aux
output switched on one at a time, over the plain matmul, on the heuristic's schedule.
    python3 -P tools/fused_epilogue_parts.py   (on the GPU machine, jaxgemm installed)"""

import jax
import jax.numpy as jnp

from jaxgemm.bench import time_ms
from jaxgemm.epilogue import EpilogueConfig, fused_matmul
from jaxgemm.gemm import GemmConfig

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096)]
# name: (bias, activation, aux)
PARTS = {
    "plain": (False, None, False),
    "bias": (True, None, False),
    "gelu": (False, "gelu", False),
    "aux": (False, None, True),
    "bias+gelu": (True, "gelu", False),
    "gelu+aux": (False, "gelu", True),
    "bias+gelu+aux": (True, "gelu", True),
}

print(f"{'M x N x K':>16} " + " ".join(f"{name:>14}" for name in PARTS) + "   (ms, x plain)")
for m, n, k in SHAPES:
    ka, kb, kc = jax.random.split(jax.random.key(0), 3)
    a, b = jax.random.normal(ka, (m, k), jnp.bfloat16), jax.random.normal(kb, (k, n), jnp.bfloat16)
    bias = jax.random.normal(kc, (n,), jnp.bfloat16)
    config = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16))
    cells, plain = [], None
    for with_bias, act, aux in PARTS.values():
        epi = EpilogueConfig(activation=act, want_aux=aux)
        fn = jax.jit(lambda a, b, bias, epi=epi, with_bias=with_bias: fused_matmul(
            a, b, None, bias if with_bias else None, None, config, epi))  # fmt: skip
        ms, _ = time_ms(fn, (a, b, bias), 40)
        plain = plain or ms
        cells.append(f"{ms:.3f} {ms / plain:.3f}")
    print(f"{f'{m}x{n}x{k}':>16} " + " ".join(f"{c:>14}" for c in cells))
