"""Which kernels XLA (cuBLAS) runs for a product, beside jaxgemm's heuristic choice: full
kernel names and CUPTI times (nvjet names carry cuBLAS's tile, stages and cluster shape).
    python3 -P tools/xla_kernels.py [dtype:M,N,K[,B][:NT] ...]
dtype: bf16, f16 or tf32 (float32 at XLA's default precision vs jaxgemm's tensorfloat32);
the layout suffix transposes the stored operands (NT: B stored (n, k)); B is a batch dimension
of both operands. Default: the bench's
tensor-core shapes."""

import statistics
import sys

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler

import jaxgemm

DEFAULT = ["bf16:8192,8192,8192", "bf16:4096,8192,4096", "bf16:16384,4096,14336", "bf16:4096,4096,4096",
           "bf16:2048,2048,2048", "bf16:8192,8192,8192:NT", "tf32:8192,8192,8192", "tf32:8192,8192,8192:NT",
           "tf32:4096,4096,4096"]


def kernels(fn, args, iterations=30):
    _, per_iter = profiler.measure(jax.jit(fn), aggregate=False, iterations=iterations)(*args)
    names = [name for name, _ in per_iter[0]]
    return [(name, statistics.median(it[i][1] for it in per_iter)) for i, name in enumerate(names)]


def main(specs):
    for spec in specs:
        dtype, dims, *layout = spec.split(":")
        m, n, k, *batch = map(int, dims.split(","))
        ta, tb = (layout[0][0] == "T", layout[0][1] == "T") if layout else (False, False)
        stored = jnp.float32 if dtype == "tf32" else {"bf16": jnp.bfloat16, "f16": jnp.float16}[dtype]
        ka, kb = jax.random.split(jax.random.key(0))
        a = jax.random.normal(ka, (*batch, *((k, m) if ta else (m, k))), stored)
        b = jax.random.normal(kb, (*batch, *((n, k) if tb else (k, n))), stored)
        op_a = (lambda x: x.mT) if ta else (lambda x: x)
        op_b = (lambda x: x.mT) if tb else (lambda x: x)
        ours_precision = "tensorfloat32" if dtype == "tf32" else None
        rows = {
            "XLA": kernels(lambda a, b: op_a(a) @ op_b(b), (a, b)),
            "jaxgemm": kernels(lambda a, b: jaxgemm.matmul(a, b, transpose_a=ta, transpose_b=tb,
                                                          precision=ours_precision), (a, b)),
        }
        print(f"{spec}:")
        for who, ks in rows.items():
            total = sum(ms for _, ms in ks)
            print(f"  {who:<8} {total * 1e3:9.1f} us  {2 * m * n * k * (batch[0] if batch else 1) / total / 1e9:6.0f} TFLOP/s")
            for name, ms in ks:
                print(f"           {ms * 1e3:9.1f} us  {name[:110]}")


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT)
