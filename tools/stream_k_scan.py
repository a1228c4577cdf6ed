"""Stream-K on vs off (JAXGEMM_STREAM_K=0 when lowering) and XLA, in alternating rounds in
one process, bf16 (or --dtype float32: tf32), on the heuristic's sm90 schedule or a forced
tile. `waves` counts the schedule's work items over its workers (blocks or 2-block clusters);
stream-K shares a last wave out only where it is at most Sm90StreamKMaxFillPercent full,
which --max-fill overrides (JAXGEMM_STREAM_K_MAX_FILL, read when lowering and at launch).
    python tools/stream_k_scan.py [--tile 256x256] [--max-fill 100] [M,N,K ...]"""

import argparse
import os

parser = argparse.ArgumentParser()
parser.add_argument("shapes", nargs="*")
parser.add_argument("--tile", default=None, help="a forced sm90 tile, e.g. 256x256 (default: the heuristic's)")
parser.add_argument("--max-fill", type=int, default=None, help="stream-K up to this last-wave fill (percent)")
parser.add_argument("--dtype", default="bfloat16")
parser.add_argument("--iterations", type=int, default=40)
args = parser.parse_args()
if args.max_fill is not None:
    os.environ["JAXGEMM_STREAM_K_MAX_FILL"] = str(args.max_fill)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jaxgemm import _ffi  # noqa: E402
from jaxgemm.bench import time_alternating_ms  # noqa: E402
from jaxgemm.gemm import GemmConfig, gemm_product  # noqa: E402

DEFAULT = [(8192, 8192, 8192), (4096, 4096, 4096), (4096, 8192, 4096), (16384, 4096, 14336), (6144, 6144, 6144),
           (8192, 8192, 4096), (8192, 8192, 16384), (3072, 8192, 8192), (5120, 5120, 5120), (2048, 8192, 8192)]


def lowered(a, b, config, stream_k):
    os.environ["JAXGEMM_STREAM_K"] = "1" if stream_k else "0"
    fn = jax.jit(lambda a, b: gemm_product(a, b, config)).lower(a, b).compile()
    os.environ.pop("JAXGEMM_STREAM_K")
    return fn


def main():
    dtype = jnp.dtype(args.dtype)
    tile = tuple(map(int, args.tile.split("x"))) if args.tile else None
    config = GemmConfig(tf32=dtype == jnp.float32, out_dtype=dtype, kernel="sm90" if tile else None, tile=tile)
    shapes = [tuple(map(int, s.split(","))) for s in args.shapes] or DEFAULT
    sms = _ffi.cuda_sm_count()
    for m, n, k in shapes:
        ka, kb = jax.random.split(jax.random.key(m + n + k))
        a = jax.random.normal(ka, (m, k), dtype)
        b = jax.random.normal(kb, (k, n), dtype)
        precision = "tensorfloat32" if dtype == jnp.float32 else None
        fns = {"on": lowered(a, b, config, True), "off": lowered(a, b, config, False),
               "xla": jax.jit(lambda a, b: jnp.dot(a, b, precision=precision))}
        ms, _ = time_alternating_ms(fns, (a, b), args.iterations // 2)
        tm, tn = tile or (128, 256)
        cluster = 2 if tile == (256, 256) else 1
        waves = (-(-m // tm)) * (-(-n // tn)) / (sms // cluster)
        print(f"{m}x{n}x{k} {args.tile or 'heuristic'}: waves {waves:5.2f}  stream-K {ms['on']:.4f} ms"
              f"  whole tiles {ms['off']:.4f} ms  XLA {ms['xla']:.4f} ms  off/on {ms['off'] / ms['on']:.3f}"
              f"  XLA/on {ms['xla'] / ms['on']:.3f}  XLA/off {ms['xla'] / ms['off']:.3f}", flush=True)


if __name__ == "__main__":
    main()
