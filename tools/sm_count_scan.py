"""Does leaving SMs idle pay? Times the heuristic's bf16 GEMM with the grid planned for
fewer SMs (JAXGEMM_SM_COUNT, read when the kernel launches) against all 132 and XLA, in
alternating rounds in one process. A count that divides the tile count into whole waves
costs no time in theory and draws less power, so the clock may rise:
python tools/sm_count_scan.py [M,N,K ...] [--sms 132,128,...]"""

import os
import statistics
import sys

import jax
import jax.numpy as jnp

from jaxgemm.bench import time_samples
from jaxgemm.gemm import GemmConfig, _gemm

DEFAULT = [(8192, 8192, 8192), (16384, 4096, 14336), (4096, 8192, 4096), (4096, 4096, 4096), (2048, 2048, 2048)]


def main(shapes, sm_counts, rounds=4, per_round=20):
    for m, n, k in shapes:
        ka, kb = jax.random.split(jax.random.key(m + n + k))
        a = jax.random.normal(ka, (m, k), jnp.bfloat16)
        b = jax.random.normal(kb, (k, n), jnp.bfloat16)
        ours = jax.jit(lambda a, b: _gemm(a, b, GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16))))
        xla = jax.jit(lambda a, b: a @ b)
        runs = [(str(s), ours, s) for s in sm_counts] + [("XLA", xla, None)]
        samples = {label: [] for label, _, _ in runs}
        for r in range(rounds):
            for label, fn, sms in runs if r % 2 == 0 else runs[::-1]:
                if sms is None:
                    os.environ.pop("JAXGEMM_SM_COUNT", None)
                else:
                    os.environ["JAXGEMM_SM_COUNT"] = str(sms)
                samples[label].extend(time_samples(fn, (a, b), per_round)[0])
        os.environ.pop("JAXGEMM_SM_COUNT", None)
        xla_ms = statistics.median(samples["XLA"])
        cells = "  ".join(f"{label} SMs {statistics.median(samples[label]):.4f} ms ({xla_ms / statistics.median(samples[label]):.3f}x)"
                          for label, _, _ in runs[:-1])
        print(f"{m}x{n}x{k}: XLA {xla_ms:.4f} ms  {cells}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    sms = [132, 128]
    if "--sms" in args:
        i = args.index("--sms")
        sms = [int(s) for s in args[i + 1].split(",")]
        del args[i:i + 2]
    main([tuple(map(int, s.split(","))) for s in args] or DEFAULT, sms)
