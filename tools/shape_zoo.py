"""jaxgemm.matmul (the heuristic's choice) against XLA on shapes that models use, not only the
benchmark's squares: token counts from 1 to 16K against common hidden / FFN / vocabulary
widths, skinny and deep K, ragged sizes, batches, other layouts and dtypes. Finds where the
heuristic is weakest; prints the cases sorted by ratio (XLA time / ours: > 1 is faster).
CUPTI kernel time, alternating rounds (jaxgemm.bench.time_pair_ms), same inputs.
    python3 -P tools/shape_zoo.py [--only SUBSTRING] [--iterations 40] [--json PATH]
--json writes the rows as jaxgemm.bench does, for tools/ab_compare.py."""

import argparse
import dataclasses
import json

import jax
import jax.numpy as jnp

import jaxgemm
from jaxgemm import _ffi
from jaxgemm.bench import time_pair_ms


@dataclasses.dataclass(frozen=True)
class Shape:
    m: int
    n: int
    k: int
    dtype: str = "bfloat16"
    layout: str = "NN"  # op(A) op(B): T means that operand is stored transposed
    batch: int = 0  # 0: no batch dimension
    precision: str | None = None

    @property
    def name(self) -> str:
        dt = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}[self.dtype]
        if self.precision:
            dt += "/tf32"
        b = f"{self.batch}x" if self.batch else ""
        return f"{dt} {self.layout} {b}{self.m}x{self.n}x{self.k}"


SHAPES = (
    # Token counts against a 4096-wide layer, and the FFN's up / down projections.
    [Shape(m, 4096, 4096) for m in (1, 32, 256, 1000, 2048, 6144)]
    + [Shape(m, 14336, 4096) for m in (16, 512, 4096)]
    + [Shape(m, 4096, 14336) for m in (16, 512, 4096)]
    + [Shape(2048, 11008, 4096), Shape(2048, 4096, 11008)]
    # Vocabulary projections, narrow projections (grouped-query attention's K / V).
    + [Shape(128, 32000, 4096), Shape(2048, 32000, 4096), Shape(512, 128256, 4096)]
    + [Shape(8192, 1024, 4096), Shape(8192, 4096, 1024), Shape(4096, 512, 512)]
    # Shallow and deep K.
    + [Shape(8192, 8192, 64), Shape(8192, 8192, 256), Shape(256, 256, 65536), Shape(1024, 1024, 32768)]
    # Ragged sizes.
    + [Shape(1000, 3000, 500), Shape(777, 1234, 4321), Shape(3000, 5000, 7000), Shape(4100, 4100, 4100)]
    # Batched products (attention-like).
    + [Shape(1024, 1024, 128, batch=16), Shape(1024, 128, 1024, batch=16), Shape(256, 256, 256, batch=64)]
    # Other layouts (a dense layer's backward: dX = dZ W^T is NT, dW = X^T dZ is TN).
    + [Shape(4096, 4096, 14336, layout="NT"), Shape(4096, 14336, 4096, layout="TN"),
       Shape(2048, 2048, 2048, layout="TT"), Shape(2048, 2048, 2048, layout="TN")]
    # Other dtypes.
    + [Shape(2048, 14336, 4096, "float16"), Shape(16, 4096, 4096, "float16")]
    + [Shape(m, n, k, "float32", precision="tensorfloat32")
       for m, n, k in ((2048, 14336, 4096), (4096, 4096, 14336), (128, 4096, 4096), (1000, 3000, 500))]
    + [Shape(m, n, k, "float32") for m, n, k in ((2048, 4096, 4096), (128, 4096, 4096), (1000, 3000, 500))]
)


def operands(s: Shape):
    ka, kb = jax.random.split(jax.random.key(s.m * 7 + s.n * 3 + s.k))
    a_shape = (s.k, s.m) if s.layout[0] == "T" else (s.m, s.k)
    b_shape = (s.n, s.k) if s.layout[1] == "T" else (s.k, s.n)
    lead = (s.batch,) if s.batch else ()
    dt = jnp.dtype(s.dtype)
    return (jax.random.normal(ka, lead + a_shape, dt), jax.random.normal(kb, lead + b_shape, dt))


def functions(s: Shape):
    ta, tb = s.layout[0] == "T", s.layout[1] == "T"
    prec = s.precision or ("highest" if s.dtype == "float32" else None)
    ours = jax.jit(lambda a, b: jaxgemm.matmul(a, b, transpose_a=ta, transpose_b=tb, precision=s.precision))

    def xla(a, b):
        a = jnp.swapaxes(a, -1, -2) if ta else a
        b = jnp.swapaxes(b, -1, -2) if tb else b
        return jnp.matmul(a, b, precision=prec)

    return ours, jax.jit(xla)


def choice(s: Shape) -> str:
    sms = _ffi.cuda_sm_count()
    batch = max(s.batch, 1)
    if s.dtype == "float32" and not s.precision:
        tm, tn, split = _ffi.simt_config(s.m, s.n, s.k, batch, sms)
        return f"simt {tm}x{tn}" + (f" split {split}" if split > 1 else "")
    if _ffi.cuda_compute_capability() != 90:
        return "sm80"
    if s.precision:
        return "sm90 tf32"  # the lowering may transpose operands first: the query would need its rewrite
    tm, tn, split = _ffi.sm90_choice(s.m, s.n, s.k, batch, sms, False, s.layout[0] == "T", s.layout[1] == "T")
    return f"sm90 {tm}x{tn}" + (f" split {split}" if split > 1 else "")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--json", help="write the rows to this file (name, m, n, k, dtype, ours_ms, xla_ms, ...)")
    args = parser.parse_args()
    rows = []
    for s in SHAPES:
        if args.only not in s.name:
            continue
        a, b = operands(s)
        ours, xla = functions(s)
        ref = xla(a, b).astype(jnp.float32)
        err = float(jnp.linalg.norm(ours(a, b).astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
        t_ours, t_xla, method = time_pair_ms(ours, xla, (a, b), args.iterations)
        rows.append((t_xla / t_ours, s, t_ours, t_xla, err))
        print(f"{s.name:<32} ours {t_ours * 1e3:9.1f} us  XLA {t_xla * 1e3:9.1f} us  {t_xla / t_ours:6.3f}x  "
              f"{choice(s):<22} rel diff {err:.1e}  ({method})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"name": s.name, "m": s.m, "n": s.n, "k": s.k, "dtype": s.dtype, "ours_ms": t_ours,
                        "xla_ms": t_xla, "xla_over_ours": ratio, "choice": choice(s), "rel_diff": err}
                       for ratio, s, t_ours, t_xla, err in rows], f, indent=1)
    print("\nsorted, slowest first:")
    for ratio, s, t_ours, t_xla, _ in sorted(rows, key=lambda r: r[0]):
        print(f"{ratio:6.3f}x  {s.name:<32} {choice(s)}")


if __name__ == "__main__":
    main()
