"""Quick check of every sm90 schedule before a long test run (a hang shows up here, under
`timeout`, instead of stalling the suite): bf16 NN and TN, a ragged shape with an odd
number of tile rows and several tiles per block, error against float32.
    timeout 90 python3 -P tools/sm90_smoke.py   (on the GPU machine, jaxgemm installed)"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxgemm.gemm import GemmConfig, gemm_product

failed = False
for tile in ((128, 128), (128, 256), (256, 256)):
    for m, n, k in ((300, 520, 200), (4100, 4104, 264), (2048, 2048, 2048)):
        for trans_b in (False, True):
            ka, kb = jax.random.split(jax.random.key(m + n + k))
            a = jax.random.normal(ka, (m, k), jnp.bfloat16)
            b = jax.random.normal(kb, (n, k) if trans_b else (k, n), jnp.bfloat16)
            config = GemmConfig(False, trans_b, False, jnp.dtype(jnp.bfloat16), split_k=1, kernel="sm90", tile=tile)
            out = np.asarray(jax.block_until_ready(gemm_product(a, b, config)), np.float32)
            bb = b.T if trans_b else b
            ref = np.asarray(jnp.matmul(a.astype(jnp.float32), bb.astype(jnp.float32), precision="highest"))
            err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
            ok = err < 1e-2
            failed |= not ok
            print(f"tile {tile} {m}x{n}x{k} trans_b={trans_b}: rel err {err:.1e} {'ok' if ok else 'FAIL'}")
sys.exit(1 if failed else 0)
