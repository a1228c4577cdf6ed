"""The decode kernel (forced: GemmConfig.kernel="decode") against the heuristic's choice and
XLA on bf16 products with few rows, per cap on its cluster size (JAXGEMM_DECODE_CLUSTER, read
at launch; "-" = the plan's): python3 -P tools/decode_sweep.py [--rows 1,16] [--clusters -,1,2,4,8]
CUPTI kernel time, alternating rounds (bench.time_alternating_ms)."""

import argparse
import itertools
import os

import jax
import jax.numpy as jnp

import jaxgemm
from jaxgemm import _ffi
from jaxgemm.bench import time_alternating_ms
from jaxgemm.gemm import GemmConfig, gemm_product

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (1024, 4096), (4096, 64))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--clusters", default="-,1,2,4,8")
    parser.add_argument("--iterations", type=int, default=40)
    args = parser.parse_args()
    sms = _ffi.cuda_sm_count()
    print(f"{'M':>4} {'N':>6} {'K':>6} {'B':>2} {'cap':>3} {'plan':>5} {'decode us':>9} {'ours us':>8} {'XLA us':>8} "
          f"{'XLA/decode':>10} {'XLA/ours':>8}")
    for m, (n, k), tb, cap in itertools.product([int(r) for r in args.rows.split(",")], SHAPES, (False, True),
                                                args.clusters.split(",")):
        ka, kb = jax.random.split(jax.random.key(m * n + k))
        a = jax.random.normal(ka, (m, k), jnp.bfloat16)
        b = jax.random.normal(kb, (n, k) if tb else (k, n), jnp.bfloat16)
        config = GemmConfig(False, tb, False, jnp.dtype(jnp.bfloat16), split_k=1, kernel="decode")
        fns = {"decode": jax.jit(lambda a, b, config=config: gemm_product(a, b, config)),
               "ours": jax.jit(lambda a, b, tb=tb: jaxgemm.matmul(a, b, transpose_b=tb)),
               "xla": jax.jit(lambda a, b, tb=tb: a @ (b.T if tb else b))}
        if cap == "-":
            os.environ.pop("JAXGEMM_DECODE_CLUSTER", None)
        else:
            os.environ["JAXGEMM_DECODE_CLUSTER"] = cap
        ms, _ = time_alternating_ms(fns, (a, b), max(1, args.iterations // 2), 4)
        plan = _ffi.decode_plan(m, n, k, 1, sms)[1]
        print(f"{m:>4} {n:>6} {k:>6} {'T' if tb else 'N':>2} {cap:>3} {plan:>5} {ms['decode'] * 1e3:9.1f} "
              f"{ms['ours'] * 1e3:8.1f} {ms['xla'] * 1e3:8.1f} {ms['xla'] / ms['decode']:10.3f} "
              f"{ms['xla'] / ms['ours']:8.3f}")


if __name__ == "__main__":
    main()
