"""The few JAX internals jaxgemm's primitives need, in one place, for JAX 0.10 and 0.11.

Each has a fallback that keeps single-device behaviour when an internal moves."""

from __future__ import annotations

import jax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

try:
    from jax._src import core as _core
except ImportError:  # pragma: no cover
    _core = None
try:
    from jax._src import dispatch as _dispatch
except ImportError:  # pragma: no cover
    _dispatch = None
try:
    from jax._src.interpreters import mlir as _mlir
except ImportError:  # pragma: no cover
    _mlir = None

ShardingTypeError = getattr(_core, "ShardingTypeError", ValueError)


def explicit_axes(mesh, axes: tuple[str, ...]) -> tuple[str, ...]:
    """The axes among `axes` that are Explicit in `mesh` (types carry only those)."""
    types = dict(zip(mesh.axis_names, mesh.axis_types))
    return tuple(a for a in axes if types.get(a) == AxisType.Explicit)


def explicit_sharding(aval):
    """aval's sharding where its mesh has Explicit axes (a gradient must come back typed
    like its primal, as JAX's own transposes make it), else None."""
    sharding = getattr(aval, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty or not explicit_axes(mesh, tuple(mesh.axis_names)):
        return None
    return sharding


def cotangent_sharding(aval, ct):
    """How a transpose types the cotangent of a primal typed `aval`, given the output
    cotangent `ct`: the primal's explicit sharding; replicated on ct's Explicit mesh where
    the primal is on no mesh (a weight closed over unsharded while the batch is sharded),
    as JAX's own transposes type it; else None."""
    sharding = explicit_sharding(aval)
    primal_mesh = getattr(getattr(aval, "sharding", None), "mesh", None)
    if sharding is not None or primal_mesh is None or not primal_mesh.empty:
        return sharding
    mesh = getattr(getattr(getattr(ct, "aval", None), "sharding", None), "mesh", None)
    if mesh is None or mesh.empty or not explicit_axes(mesh, tuple(mesh.axis_names)):
        return None
    return NamedSharding(mesh, P())


def match_varying(args):
    """Operands cast to vary over the union of their varying manual axes (shard_map with
    check_vma), as JAX does for its own primitives; its transpose is the psum the gradient
    of a replicated operand needs."""
    insert = getattr(_core, "auto_insert_reshard", None) or getattr(_core, "standard_insert_pvary", None)
    return tuple(insert(*args)) if insert is not None and args else tuple(args)


def result_aval(avals, shape, dtype, sharding):
    """A result aval that keeps the operands' varying manual axes, with `sharding` (None:
    unsharded on the operands' mesh)."""
    base = avals[0]
    if sharding is None:
        sharding = NamedSharding(base.sharding.mesh, P(*([None] * len(shape))))
    return base.update(shape=tuple(shape), dtype=dtype, weak_type=False, sharding=sharding)


def with_sharding_in_types(ctx, value, aval):
    """The sharding constraint JAX puts on a primitive's result in Explicit mode."""
    lower = getattr(_mlir, "lower_with_sharding_in_types", None)
    return value if lower is None else lower(ctx, value, aval)


def requires_devices_during_lowering(prim) -> None:
    """custom_partitioning inside a primitive's lowering needs the device assignment."""
    registry = getattr(_dispatch, "prim_requires_devices_during_lowering", None)
    if registry is not None:
        registry.add(prim)


def xla_out_sharding(x, y, dims):
    """For XLA's dots traced on Explicit-typed operands (custom_partitioning traces an
    op's local whole, on the global types), which cannot always infer their result's
    sharding: the entries of x's and y's dims named by `dims` ((operand, dim) pairs, None:
    unsplit), as the keyword arguments {"out_sharding": ...}; else none."""
    shardings = [explicit_sharding(jax.typeof(a)) for a in (x, y)]
    mesh = next((s.mesh for s in shardings if s is not None), None)
    if mesh is None:
        return {}
    specs = [() if s is None else tuple(s.spec) for s in shardings]
    entry = lambda o, d: specs[o][d] if d < len(specs[o]) else None  # noqa: E731
    return {"out_sharding": NamedSharding(mesh, P(*(None if pair is None else entry(*pair) for pair in dims)))}


def max_over_varying(x):
    """x's maximum over the manual axes it varies over (shard_map with check_vma), so that
    it comes back invariant: a whole tensor's amax from each device's part of it."""
    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)  # (older JAX; 0.10 and 0.11 keep it in the manual axis type)
    vma = tuple(sorted(vma if vma is not None else getattr(getattr(aval, "mat", None), "varying", ())))
    return jax.lax.pmax(x, vma) if vma else x
