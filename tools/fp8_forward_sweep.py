"""Where fp8.dense's forward product spends its time: the per-row fp8 kernel at a layer's
forward shape (tokens x out x in) with nothing but its scales, then with bias + gelu, then
with the pre-activation z written too (as fp8.dense's forward), on the heuristic's schedule
and on each sm90 fp8 schedule forced; CUPTI medians against the product alone, in one process.
    python3 -P tools/fp8_forward_sweep.py [--shapes 32768x4096x1024,...]   (a Hopper GPU)
The forward writes y and z: at 32768 x 4096 that is 512 MiB (~0.17 ms of stores), about
the product's own time at the fp8 rate; a schedule that overlaps the stores with the next
tile's products would take ~max of the two, one that does not their sum."""

import argparse

import jax
import jax.numpy as jnp

from jaxgemm.bench import time_alternating_ms
from jaxgemm.fp8 import quantize_rows
from jaxgemm.scaled import fp8_kernel_call

TILES = [None, (256, 256), (128, 256), (128, 128), (128, 64)]  # None: the heuristic's
VARIANTS = {"scales": {}, "+bias gelu": {"activation": "gelu"}, "+z": {"activation": "gelu", "want_aux": True}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="32768x4096x1024,32768x1024x4096")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}")
    heads = " ".join(f"{v:>16}" for v in VARIANTS)
    print(f"{'tokens x out x in':>20} {'tile':>10} {heads}  (ms, x scales alone)")
    for shape in args.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        kx, kw, kb = jax.random.split(jax.random.key(0), 3)
        (qx, sx), (qw, sw) = quantize_rows(jax.random.normal(kx, (m, k), jnp.bfloat16)), quantize_rows(
            (jax.random.normal(kw, (n, k), jnp.float32) * k**-0.5).astype(jnp.bfloat16))
        bias = jax.random.normal(kb, (1, n), jnp.bfloat16)
        inputs = (qx[None], qw[None], sx[None], sw[None], bias)
        for tile in TILES:
            fns = {}
            for name, extra in VARIANTS.items():
                def run(a, b, sa, sb, bias, extra=extra, tile=tile):
                    return fp8_kernel_call(a, b, sa, sb, jnp.bfloat16, "cuda", bias=bias if extra else None,
                                           tile=tile, **extra)  # fmt: skip
                fns[name] = jax.jit(run)
            try:
                ms, _ = time_alternating_ms(fns, inputs, per_round=10)
            except Exception as e:  # a forced schedule the handler refuses here
                print(f"{shape:>20} {str(tile):>10}  refused: {str(e).splitlines()[0][:80]}")
                continue
            base = ms["scales"]
            cells = " ".join(f"{ms[v]:7.3f} ({ms[v] / base:.2f}x)" for v in VARIANTS)
            print(f"{shape:>20} {str(tile or 'heuristic'):>10} {cells}")


if __name__ == "__main__":
    main()
