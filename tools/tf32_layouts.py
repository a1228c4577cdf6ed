"""tf32 in every stored layout against XLA's NN product (float32 at its default precision),
in alternating rounds, with the kernels each of our calls launches (an XLA transpose shows
as `wrapped_transpose`) and the cost of one such copy alone:
    python3 -P tools/tf32_layouts.py [size ...]   (on the GPU machine, jaxgemm installed)"""

import sys

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler

import jaxgemm
from jaxgemm.bench import time_alternating_ms


def kernel_names(fn, args):
    _, per_iter = profiler.measure(jax.jit(fn), aggregate=False, iterations=3)(*args)
    return [name[:70] for name, _ in per_iter[0]]


def main(sizes):
    for s in sizes:
        ka, kb = jax.random.split(jax.random.key(s))
        a, b = jax.random.normal(ka, (s, s), jnp.float32), jax.random.normal(kb, (s, s), jnp.float32)
        fns = {"XLA NN": lambda a, b: jnp.matmul(a, b)}
        for ta, tb in ((False, False), (False, True), (True, True), (True, False)):
            tag = ("T" if ta else "N") + ("T" if tb else "N")
            fns[f"ours {tag}"] = lambda a, b, ta=ta, tb=tb: jaxgemm.matmul(
                a, b, transpose_a=ta, transpose_b=tb, precision="tensorfloat32")
        fns["XLA copy"] = lambda a, b: b.T + 0
        print(f"tf32 {s}^3")
        for name in ("ours NN", "ours TT", "ours TN"):
            print(f"  {name} kernels: {kernel_names(fns[name], (a, b))}")
        ms, _ = time_alternating_ms({k: jax.jit(v) for k, v in fns.items()}, (a, b), 15, 4)
        print("  " + ", ".join(f"{k} {v * 1e3:.1f} us ({ms['XLA NN'] / v:.3f}x)" for k, v in ms.items()), flush=True)


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1:]] or [8192, 4096, 2048])
