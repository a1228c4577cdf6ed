"""Power, SM clock and throttle reasons while one kernel runs back to back: jaxgemm's bf16
GEMM (the heuristic's schedule, or each forced sm90 tile) and XLA's, a few seconds each,
sampled by nvidia-smi every 50 ms. Says whether a time difference comes with a clock
difference (power-bound) or not (work per clock):
    python tools/power_probe.py [M,N,K ...] [--tiles 256x256,128x256] [--f32]
--f32: float32 at full precision (ours: SIMT, tiles forced on A stored as (K, M), as the
heuristic stores large operands; XLA: precision="highest")."""

import statistics
import subprocess
import sys
import time
from datetime import datetime

import jax
import jax.numpy as jnp

from jaxgemm.gemm import GemmConfig, _gemm

FIELDS = "timestamp,power.draw,clocks.sm,temperature.gpu,clocks_throttle_reasons.active"


def run_for(fn, args, seconds):
    jax.block_until_ready(fn(*args))
    calls, start = 0, time.time()
    while time.time() - start < seconds:
        out = None
        for _ in range(20):
            out = fn(*args)
        jax.block_until_ready(out)
        calls += 20
    return start, time.time(), (time.time() - start) / calls * 1e3


def main(shapes, tiles, f32=False, seconds=4.0):
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)
    windows = []
    for m, n, k in shapes:
        ka, kb = jax.random.split(jax.random.key(m + n + k))
        dtype = jnp.float32 if f32 else jnp.bfloat16
        a = jax.random.normal(ka, (m, k), dtype)
        b = jax.random.normal(kb, (k, n), dtype)
        a_t = a.T.copy() if f32 else None  # A stored (K, M) for forced SIMT tiles, made outside the timing
        runs = [("XLA", jax.jit(lambda a, a_t, b: jnp.dot(a, b, precision="highest" if f32 else None)))]
        for tile in tiles:
            label = f"ours {tile[0]}x{tile[1]}" if tile else "ours"
            if f32 and tile:
                config = GemmConfig(transpose_a=True, split_k=1, kernel="simt", tile=tile)
                runs.append((label, jax.jit(lambda a, a_t, b, c=config: _gemm(a_t, b, c))))
                continue
            config = GemmConfig(out_dtype=jnp.dtype(dtype), kernel="sm90" if tile else None, tile=tile)
            runs.append((label, jax.jit(lambda a, a_t, b, c=config: _gemm(a, b, c))))
        for label, fn in runs + runs[::-1]:
            t0, t1, ms = run_for(fn, (a, a_t, b), seconds)
            windows.append((f"{m}x{n}x{k} {label}", t0 + 1.0, t1, ms))  # skip the first second
            time.sleep(1.0)
    smi.terminate()
    samples = []
    for line in smi.stdout.read().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((t, float(parts[1]), float(parts[2]), float(parts[3]), parts[4]))
        except (ValueError, IndexError):
            continue
    for label, t0, t1, ms in windows:
        inside = [s for s in samples if t0 <= s[0] <= t1]
        if not inside:
            print(f"{label}: no samples")
            continue
        reasons = sorted({s[4] for s in inside})
        print(f"{label:28s} wall {ms:.4f} ms/call  power {statistics.median(s[1] for s in inside):6.1f} W  "
              f"SM clock {statistics.median(s[2] for s in inside):6.0f} MHz  temp {max(s[3] for s in inside):.0f} C  "
              f"throttle {','.join(reasons)}  ({len(inside)} samples)", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    tiles = [None]
    if "--tiles" in args:
        i = args.index("--tiles")
        tiles = [tuple(map(int, t.split("x"))) for t in args[i + 1].split(",")]
        del args[i:i + 2]
    f32 = "--f32" in args
    args = [a for a in args if a != "--f32"]
    main([tuple(map(int, s.split(","))) for s in args] or [(8192, 8192, 8192), (4096, 4096, 4096)], tiles, f32)
