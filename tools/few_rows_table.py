"""jaxgemm.matmul (the heuristic's choice) against XLA on bf16 products with few rows,
over weight shapes of LLM layers and both stored layouts of B (x @ w and x @ w.T):
python tools/few_rows_table.py. CUPTI kernel time, alternating rounds (bench.time_pair_ms)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np

import jaxgemm
from jaxgemm import _ffi
from jaxgemm.bench import time_pair_ms


def main():
    sms = _ffi.cuda_sm_count()
    ratios = []
    print(f"{'M':>4} {'N':>6} {'K':>6} {'B':>2} {'choice':>14} {'ours us':>8} {'XLA us':>8} {'XLA/ours':>8}")
    for m, (n, k), tb in itertools.product((1, 16, 64), ((4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192)),
                                           (False, True)):
        ka, kb = jax.random.split(jax.random.key(m * n + k))
        a = jax.random.normal(ka, (m, k), jnp.bfloat16)
        b = jax.random.normal(kb, (n, k) if tb else (k, n), jnp.bfloat16)
        ours = jax.jit(lambda a, b, tb=tb: jaxgemm.matmul(a, b, transpose_b=tb))
        xla = jax.jit(lambda a, b, tb=tb: a @ (b.T if tb else b))
        ours_ms, xla_ms, _ = time_pair_ms(ours, xla, (a, b), 40)
        ratios.append(xla_ms / ours_ms)
        choice = "x".join(map(str, _ffi.sm90_choice(m, n, k, 1, sms)))
        print(f"{m:>4} {n:>6} {k:>6} {'T' if tb else 'N':>2} {choice:>14} {ours_ms * 1e3:8.1f} {xla_ms * 1e3:8.1f} "
              f"{xla_ms / ours_ms:8.3f}")
    print(f"geometric mean XLA/ours: {float(np.exp(np.mean(np.log(ratios)))):.3f}")


if __name__ == "__main__":
    main()
