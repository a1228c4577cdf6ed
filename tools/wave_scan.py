"""Wave quantization: times of XLA and of jaxgemm (heuristic, and each large sm90
schedule) for M around the boundaries of full waves of 128-row tiles, N = K fixed.
If a kernel wastes its last, partly filled wave, its time stays flat from M = 8192
(15.5 waves of 128 x 256 on 132 SMs) to 8448 (16.0); a kernel that balances the tail
grows with the work (x 1.031).
python tools/wave_scan.py [N [M ...]]   (default N = 8192, M = 7680 8192 8448)"""

import dataclasses
import sys

import jax
import jax.numpy as jnp

from jaxgemm.bench import time_pair_ms
from jaxgemm.gemm import GemmConfig, gemm_product


def main(n, ms):
    base = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16))
    configs = [("heuristic", base)] + [
        (f"{t[0]}x{t[1]}", dataclasses.replace(base, kernel="sm90", tile=t, split_k=1))
        for t in ((256, 256), (128, 256), (128, 128))]
    for m in ms:
        ka, kb = jax.random.split(jax.random.key(m))
        a = jax.random.normal(ka, (m, n), jnp.bfloat16)
        b = jax.random.normal(kb, (n, n), jnp.bfloat16)
        flops = 2.0 * m * n * n
        xla = jax.jit(jnp.matmul)
        for label, config in configs:
            ours = jax.jit(lambda a, b, config=config: gemm_product(a, b, config))
            t_ours, t_xla, _ = time_pair_ms(ours, xla, (a, b), 50)
            print(f"M={m:6d} N=K={n} {label:<10} ours {t_ours:.4f} ms ({flops / t_ours / 1e9:6.1f} TF/s)"
                  f"  XLA {t_xla:.4f} ms ({flops / t_xla / 1e9:6.1f})  ratio {t_xla / t_ours:.3f}", flush=True)


if __name__ == "__main__":
    args = [int(x) for x in sys.argv[1:]]
    n = args[0] if args else 8192
    main(n, args[1:] or [7680, 8192, 8448])
