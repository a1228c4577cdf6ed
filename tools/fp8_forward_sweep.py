"""Where fp8.dense's forward product spends its time: the per-row fp8 kernel at a layer's
forward shape (tokens x out x in) with nothing but its scales ("plain"), then with each part
of the epilogue switched on alone (bias, relu, gelu, the pre-activation z as "aux") and
together (bias + gelu + aux is fp8.dense's forward), on the heuristic's schedule and on each
sm90 fp8 schedule forced; then the same parts on bf16 `fused_matmul` (the heuristic's
schedule) for comparison. CUPTI medians in alternating rounds, one process.
    python3 -P tools/fp8_forward_sweep.py [--shapes 32768x4096x1024,...] [--tiles heuristic,128x128]
The forward writes y and z: at 32768 x 4096 that is 512 MiB (~0.17 ms of stores), about
the product's own time at the fp8 rate; a schedule that overlaps the stores with the next
tile's products would take ~max of the two, one that does not their sum."""

import argparse

import jax
import jax.numpy as jnp

from jaxgemm.bench import time_alternating_ms
from jaxgemm.epilogue import EpilogueConfig, fused_matmul
from jaxgemm.fp8 import quantize_rows
from jaxgemm.gemm import GemmConfig
from jaxgemm.scaled import fp8_kernel_call

TILES = ["heuristic", "256x256", "128x256", "128x128", "128x64"]
# part: (bias, activation, aux)
PARTS = {"plain": (False, None, False), "bias": (True, None, False), "relu": (False, "relu", False),
         "gelu": (False, "gelu", False), "aux": (False, None, True), "bias+gelu": (True, "gelu", False),
         "bias+gelu+aux": (True, "gelu", True)}  # fmt: skip


def fp8_parts(tile):
    def part(with_bias, activation, aux):
        def run(a, b, sa, sb, bias):
            return fp8_kernel_call(a, b, sa, sb, jnp.bfloat16, "cuda", bias=bias if with_bias else None,
                                   activation=activation, want_aux=aux, tile=tile)  # fmt: skip
        return jax.jit(run)
    return {name: part(*spec) for name, spec in PARTS.items()}


def bf16_parts():
    config = GemmConfig(out_dtype=jnp.dtype(jnp.bfloat16))
    def part(with_bias, activation, aux):
        epilogue = EpilogueConfig(activation=activation, want_aux=aux)
        return jax.jit(lambda x, wt, bias: fused_matmul(x, wt, None, bias[0] if with_bias else None, None, config,
                                                        epilogue))  # fmt: skip
    return {name: part(*spec) for name, spec in PARTS.items()}


def row(label, ms):
    plain = ms["plain"]
    print(f"{label:>34} " + " ".join(f"{ms[p]:6.3f} ({ms[p] / plain:.2f})" for p in PARTS), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="32768x4096x1024,32768x1024x4096")
    parser.add_argument("--tiles", default=",".join(TILES), help="heuristic and/or TMxTN schedules")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}; ms (x plain)")
    print(f"{'tokens x out x in, kernel, tile':>34} " + " ".join(f"{p:>14}" for p in PARTS))
    for shape in args.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        kx, kw, kb = jax.random.split(jax.random.key(0), 3)
        x = jax.random.normal(kx, (m, k), jnp.bfloat16)
        w = (jax.random.normal(kw, (n, k), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
        bias = jax.random.normal(kb, (1, n), jnp.bfloat16)
        (qx, sx), (qw, sw) = quantize_rows(x), quantize_rows(w)
        for name in args.tiles.split(","):
            tile = None if name == "heuristic" else tuple(int(v) for v in name.split("x"))
            try:
                ms, _ = time_alternating_ms(fp8_parts(tile), (qx[None], qw[None], sx[None], sw[None], bias), 10)
            except Exception as e:  # a forced schedule the handler refuses here
                print(f"{shape:>20} fp8 {name:>9}  refused: {str(e).splitlines()[0][:80]}")
                continue
            row(f"{shape} fp8 {name}", ms)
        ms, _ = time_alternating_ms(bf16_parts(), (x, w.T, bias), 10)
        row(f"{shape} bf16 heuristic", ms)


if __name__ == "__main__":
    main()
