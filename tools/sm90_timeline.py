"""Where the sm90 kernel's fixed cost goes: three launches per case with JAXGEMM_TIMELINE=1
(the first after other kernels, with cold caches), which makes the launcher print when the
blocks reached each point of their first two work items (ffi_src/gemm/sm90/timeline.cuh),
beside the call's CUPTI time and XLA's.
    python3 -P tools/sm90_timeline.py [case index | M,N,K[,TMxTN] ...]   (on the GPU machine, jaxgemm installed)
(M,N,K: a bf16 product on the heuristic's schedule, or on a forced sm90 tile TM x TN.)
The launches follow JAXGEMM_SM_COUNT when it is set (fewer SMs: the same work per block,
fewer blocks storing at once)."""

import os
import sys

import jax
import jax.numpy as jnp

from jaxgemm.bench import time_ms
from jaxgemm.epilogue import EpilogueConfig, fused_matmul
from jaxgemm.gemm import GemmConfig, gemm_product

# (M, N, K, kernel, tile, epilogue); kernel None: the heuristic; epilogue "fused": + bias,
# gelu and aux; "f32": float32 output (TMA stores of 64 x 32 boxes); "tf32": float32 inputs
# and output, NN (run transposed: tf32 NN's kernel computes D^T).
CASES = [
    (2048, 2048, 2048, None, None, ""),
    (2048, 2048, 2048, None, None, "f32"),
    (2048, 2048, 512, None, None, ""),
    (2048, 2048, 2048, "sm90", (256, 256), ""),
    (1536, 1408, 1024, "sm90", (128, 128), ""),
    (8192, 8192, 8192, None, None, ""),
    (8192, 8192, 8192, None, None, "fused"),
    (4096, 4096, 4096, None, None, ""),
    (4096, 4096, 4096, None, None, "f32"),
    (4096, 4096, 4096, None, None, "tf32"),
    (8192, 8192, 8192, None, None, "tf32"),
]


def parse_case(arg):
    """A CASES index, or M,N,K[,TMxTN]: a bf16 product on the heuristic's schedule or a forced sm90 tile."""
    if arg.isdigit():
        return CASES[int(arg)]
    fields = arg.split(",")
    tile = tuple(map(int, fields[3].split("x"))) if len(fields) > 3 else None
    return (*map(int, fields[:3]), "sm90" if tile else None, tile, "")


picked = [parse_case(a) for a in sys.argv[1:]] or CASES
for m, n, k, kernel, tile, epilogue in picked:
    ka, kb, kc = jax.random.split(jax.random.key(0), 3)
    tf32 = epilogue == "tf32"
    dtype = jnp.float32 if tf32 else jnp.bfloat16
    a, b = jax.random.normal(ka, (m, k), dtype), jax.random.normal(kb, (k, n), dtype)
    out = jnp.float32 if epilogue in ("f32", "tf32") else jnp.bfloat16
    config = GemmConfig(tf32=tf32, out_dtype=jnp.dtype(out), kernel=kernel, tile=tile)
    if epilogue == "fused":
        bias = jax.random.normal(kc, (n,), jnp.bfloat16)
        epi = EpilogueConfig(activation="gelu", want_aux=True)
        fn = jax.jit(lambda a, b, config=config, epi=epi, bias=bias: fused_matmul(
            a, b, None, bias, None, config, epi))  # fmt: skip
    else:
        fn = jax.jit(lambda a, b, config=config: gemm_product(a, b, config))
    ours, _ = time_ms(fn, (a, b), 30)
    xla, _ = time_ms(jax.jit(jnp.matmul), (a, b), 30)
    label = f"{kernel or 'heuristic'} {tile or ''} {epilogue}"
    print(f"\n{m}x{n}x{k} {label}: ours {ours * 1e3:.1f} us, XLA (plain) {xla * 1e3:.1f} us", flush=True)
    # The first launch after other work (cold instruction caches), then two more.
    os.environ["JAXGEMM_TIMELINE"] = "1"
    for _ in range(3):
        jax.block_until_ready(fn(a, b))
    del os.environ["JAXGEMM_TIMELINE"]
    sys.stderr.flush()
