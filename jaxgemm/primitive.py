"""The one pattern every jaxgemm primitive follows.

An op is declared once, with `define`, by named slots:

    abstract   shapes and dtypes of the results (`Result`s) from the operands' avals
    rule       how the dims of operands and results relate (a `Rule`: a factor name per
               dim, einsum-like, or a compound dim of several); it gives the results'
               shardings in Explicit mode,
               Shardy's propagation rule in Auto mode, and the per-shard partitioning
    local      the computation on one device's shards (jnp + FFI calls); it receives the
               mesh axes of every sharded factor and sums contracted factors itself
               (`psum`), so an epilogue after a contraction runs once, after the sum
    batch      vmap
    jvp        forward-mode derivative (reverse mode is JAX's transpose of it)
    transpose  for ops that are linear in some operands

`define` wires them into a JAX primitive: eager calls compile the op alone, abstract
evaluation carries shardings (Explicit mode) and varying manual axes (shard_map), and
ops whose `local` runs a custom call lower through `custom_partitioning`, so XLA
partitions them from the rule instead of gathering every operand.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxgemm import _compat, xla_cpu


class Result(NamedTuple):
    shape: tuple[int, ...]
    dtype: Any


@dataclasses.dataclass(frozen=True)
class Rule:
    """Factor names per dim of each operand and result. A factor that no result has is
    contracted; factors in `replicated` (a convolution's window dims) are never sharded.
    A dim may be a tuple of factors, major first (Shardy's compound dim: a block-scaled
    operand's K is (blocks, values in a block), whose scales have the blocks alone); its
    minor factors are replicated and their sizes given in `factor_sizes` ((name, size)
    pairs), so it shards on its major factor only, over whole blocks."""

    operands: tuple[tuple, ...]
    results: tuple[tuple, ...]
    replicated: frozenset = frozenset()
    factor_sizes: tuple[tuple[str, int], ...] = ()

    @property
    def contracted(self) -> frozenset:
        kept = {f for dims in self.results for f in _factors(dims)}
        return frozenset(f for dims in self.operands for f in _factors(dims) if f not in kept)

    @property
    def never_sharded(self) -> frozenset:
        return self.replicated | {f for f, _ in self.factor_sizes}

    def major_size(self, dim, size: int) -> int:
        """The size of `dim`'s major factor, for a dim of `size` elements."""
        return size if isinstance(dim, str) else size // int(np.prod([dict(self.factor_sizes)[f] for f in dim[1:]]))

    def shardy(self) -> tuple[str, dict]:
        """The rule in Shardy's einsum-like notation for custom_partitioning."""
        def text(dims):
            return " ".join(d if isinstance(d, str) else "(" + " ".join(d) + ")" for d in dims)

        rule = ", ".join(map(text, self.operands)) + " -> " + ", ".join(map(text, self.results))
        order = list(dict.fromkeys(f for dims in self.operands + self.results for f in _factors(dims)))
        replicated = tuple(f for f in order if f in self.never_sharded)  # Shardy wants them in factor order
        return rule, {**({"need_replication_factors": replicated} if replicated else {}), **dict(self.factor_sizes)}


def _major(dim) -> str:
    """The factor that shards a dim: its only one, or a compound dim's first."""
    return dim if isinstance(dim, str) else dim[0]


def _factors(dims) -> tuple[str, ...]:
    """Every factor of some dims, compound ones included."""
    return tuple(f for d in dims for f in ((d,) if isinstance(d, str) else d))


def _axes_of(entry) -> tuple[str, ...]:
    """A PartitionSpec entry as a tuple of mesh axis names."""
    if entry is None or entry is P.UNCONSTRAINED:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _entry(axes: tuple[str, ...]):
    return None if not axes else (axes[0] if len(axes) == 1 else axes)


def factor_axes(rule: Rule, shapes: Sequence[tuple[int, ...]], specs: Sequence[Any], mesh_shape: dict) -> dict:
    """Mesh axes per factor from the operands' specs: the first operand that shards a factor
    decides; a factor that is replicated by the rule, or whose size the axes do not divide,
    stays whole (its operands are gathered: correct, never a partial answer); an axis
    serves one factor only."""
    axes: dict[str, tuple[str, ...]] = {}
    used: set[str] = set()
    for dims, shape, spec in zip(rule.operands, shapes, specs):
        spec = tuple(spec) + (None,) * (len(dims) - len(tuple(spec)))
        for dim, size, entry in zip(dims, shape, spec):
            factor, size, want = _major(dim), rule.major_size(dim, size), _axes_of(entry)
            if factor in axes or not want or factor in rule.never_sharded:
                continue
            ways = int(np.prod([mesh_shape[a] for a in want]))
            if size % ways or used & set(want):
                continue
            axes[factor] = want
            used |= set(want)
    return axes


def _spec(dims, axes: dict) -> P:
    return P(*(_entry(axes.get(_major(d), ())) for d in dims))


# ---------------------------------------------------------------------------------------
# Explicit mode: the results' shardings in their types.


def _result_shardings(name, rule: Rule, avals, out_sharding) -> list:
    """Shardings of the results as `jnp` ops type them: each result dim takes its factor's
    explicit axes; a factor sharded differently by two operands, or contracted while
    sharded in two operands, is an error (as for `jnp.matmul`) unless `out_sharding` says
    what the first result should be."""
    mesh = next((a.sharding.mesh for a in avals if not a.sharding.mesh.empty), None)
    if mesh is None:
        return [None] * len(rule.results)
    axes: dict[str, tuple[str, ...]] = {}
    contracted_by: dict[str, int] = {}
    for i, (dims, aval) in enumerate(zip(rule.operands, avals)):
        for factor, entry in zip(map(_major, dims), aval.sharding.spec):
            got = _compat.explicit_axes(mesh, _axes_of(entry))
            if not got:
                continue
            if factor in axes and axes[factor] != got and out_sharding is None:
                raise _compat.ShardingTypeError(
                    f"{name}: operand {i} shards dim {factor!r} over {got} but another operand over "
                    f"{axes[factor]}; specs {[str(a.sharding.spec) for a in avals]}. Reshard one of them "
                    "or pass out_sharding")
            axes.setdefault(factor, got)
            if factor in rule.contracted:
                contracted_by[factor] = contracted_by.get(factor, 0) + 1
    both = [f for f, count in contracted_by.items() if count > 1]
    if both and out_sharding is None:
        raise _compat.ShardingTypeError(
            f"{name}: the contracting dimension is sharded in both operands ({[str(a.sharding.spec) for a in avals]}) "
            "and it is ambiguous how the output should be sharded. Please specify the output sharding via "
            "the `out_sharding` parameter.")
    shardings = [NamedSharding(mesh, _spec(dims, {f: a for f, a in axes.items() if f not in rule.never_sharded}))
                 for dims in rule.results]
    if out_sharding is not None:
        shardings[0] = NamedSharding(mesh, P(*out_sharding.spec))
    return shardings


# ---------------------------------------------------------------------------------------
# Auto mode: custom_partitioning from the rule.


@dataclasses.dataclass(frozen=True)
class _Static:
    """What the partitioner needs besides the operands (hashable: a static argument)."""

    op: Any
    platform: str
    params: tuple
    rule: Rule


def _partitioned(static: _Static, *args):
    return tuple(static.op.local(*args, platform=static.platform, axes={}, **dict(static.params)))


def _shardy_rule(static: _Static, mesh, operand_types, result_types):
    return static.rule.shardy()


def _scatter_targets(rule: Rule, axes: dict, result_shape, mesh_shape: dict) -> dict:
    """Result dims the partitioner wants sharded over the axes of a contraction (a
    sequence-parallel output): "scatter:<factor>" -> those axes, so that the sum of the
    partial products is a reduce-scatter along that dim instead of an all-reduce."""
    summed = {a for f in rule.contracted for a in axes.get(f, ())}
    targets = {}
    for dims, result in zip(rule.results, result_shape):
        spec = tuple(getattr(result.sharding, "spec", P()))
        for factor, size, entry in zip(map(_major, dims), result.shape, spec + (None,) * (len(dims) - len(spec))):
            want = _axes_of(entry)
            free = factor not in axes and factor not in rule.never_sharded and not targets
            if want and free and set(want) <= summed and size % int(np.prod([mesh_shape[a] for a in want])) == 0:
                targets[SCATTER + factor] = want
    return targets


_NO_MESH = jax.sharding.AbstractMesh((), ())


def _partition(static: _Static, mesh, arg_shapes, result_shape):
    rule = static.rule
    specs = [getattr(s.sharding, "spec", P()) for s in arg_shapes]
    axes = factor_axes(rule, [s.shape for s in arg_shapes], specs, dict(mesh.shape))
    scattered = _scatter_targets(rule, axes, result_shape, dict(mesh.shape))
    # Operands of the contraction stay whole along a scattered dim; those added after it
    # (an epilogue's residual) come split like the result.
    after_sum = {**axes, **{f[len(SCATTER):]: a for f, a in scattered.items()}}
    arg_shardings = tuple(NamedSharding(mesh, _spec(dims, axes if rule.contracted & set(_factors(dims)) else after_sum))
                          for dims in rule.operands)  # fmt: skip
    result_shardings = tuple(NamedSharding(mesh, _spec(dims, after_sum)) for dims in rule.results)
    local_axes = {**axes, **scattered}

    def lower(*args):
        # Per-shard code is untyped by the caller's mesh (jax 0.11 gives a psum_scatter
        # traced under an Explicit mesh the mesh's shardings on its scalars, and fails).
        with jax.sharding.use_abstract_mesh(_NO_MESH):
            return tuple(static.op.local(*args, platform=static.platform, axes=local_axes, **dict(static.params)))

    return mesh, lower, result_shardings, arg_shardings


_custom = custom_partitioning(_partitioned, static_argnums=(0,))
_custom.def_partition(_partition, sharding_rule=_shardy_rule)


# ---------------------------------------------------------------------------------------
# The declaration.


# Op.jvp for ops bilinear in their first two operands; any further operands (a grouped
# GEMM's integer group sizes) are constants of the op, not differentiated.
BILINEAR = "bilinear"


def _bilinear_jvp(op, primals, tangents, **params):
    x, y, *rest = primals
    dx, dy = (None if type(t) is ad.Zero else t for t in tangents[:2])
    outs = op.bind(x, y, *rest, **params)
    parts = ([op.bind(dx, y, *rest, **params)] if dx is not None else []) + (
        [op.bind(x, dy, *rest, **params)] if dy is not None else [])
    if not parts:
        return outs, [ad.Zero.from_primal_value(o) for o in outs]
    return outs, [functools.reduce(jax.numpy.add, ts) for ts in zip(*parts)]


@dataclasses.dataclass(frozen=True, eq=False)
class Op:
    """One primitive's slots (see the module docstring); `bind` is how callers apply it."""

    name: str
    abstract: Callable[..., Sequence[Result]]
    rule: Callable[..., Rule]
    local: Callable[..., Sequence[Any]]
    batch: Callable | None = None
    jvp: Callable | None = None
    transpose: Callable | None = None
    # local runs an FFI call: partition it from the rule (on a CPU with JAXGEMM_CPU unset
    # local is XLA's own ops, which XLA partitions itself)
    custom_call: bool = True
    # partition from the rule on a CPU too (XLA's ops in local cannot type Explicit mode)
    rule_on_cpu: bool = False
    primitive: Primitive = dataclasses.field(default=None, init=False)

    def bind(self, *args, **params) -> list:
        """The results (a list) of the op on `args`; operands varying over different
        manual axes (shard_map) are first cast to vary over all of them, like jnp does."""
        return self.primitive.bind(*_compat.match_varying(args), **params)


def define(op: Op) -> Op:
    """Makes `op`'s primitive (`op.primitive`) and registers its slots with JAX."""
    prim = Primitive(op.name)
    prim.multiple_results = True
    object.__setattr__(op, "primitive", prim)

    @functools.partial(jax.jit, static_argnames="params")
    def impl(*args, params):
        return prim.bind(*args, **dict(params))

    prim.def_impl(lambda *args, **params: impl(*args, params=tuple(sorted(params.items()))))

    def abstract_eval(*avals, **params):
        results = op.abstract(*avals, **params)
        shardings = _result_shardings(op.name, op.rule(*avals, **params), avals, params.get("out_sharding"))
        return [_compat.result_aval(avals, r.shape, r.dtype, s) for r, s in zip(results, shardings)]

    prim.def_abstract_eval(abstract_eval)

    def lowering(ctx, *args, platform, **params):
        if op.custom_call and (op.rule_on_cpu or not xla_cpu.enabled(platform)):
            static = _Static(op, platform, tuple(sorted(params.items())), op.rule(*ctx.avals_in, **params))
            fun = functools.partial(_call_partitioned, static=static)
        else:
            fun = functools.partial(_call_local, op=op, platform=platform, params=params)
        outs = mlir.lower_fun(fun, multiple_results=True)(ctx, *args)
        return [_compat.with_sharding_in_types(ctx, o, aval) for o, aval in zip(outs, ctx.avals_out)]

    for platform in ("cpu", "cuda"):
        mlir.register_lowering(prim, functools.partial(lowering, platform=platform), platform=platform)
    if op.custom_call:
        _compat.requires_devices_during_lowering(prim)
    if op.batch is not None:
        batching.primitive_batchers[prim] = op.batch
    if op.jvp is BILINEAR:
        ad.primitive_jvps[prim] = functools.partial(_bilinear_jvp, op)
    elif op.jvp is not None:
        ad.primitive_jvps[prim] = op.jvp
    if op.transpose is not None:
        ad.primitive_transposes[prim] = op.transpose
    return op


def _call_partitioned(*args, static: _Static):
    return list(_custom(static, *args))


def _call_local(*args, op, platform, params):
    return list(op.local(*args, platform=platform, axes={}, **params))


SCATTER = "scatter:"


def psum_over(x, axes: dict, factors, dims=()) -> Any:
    """x (a result with factor names `dims`) summed over the mesh axes that shard any of
    `factors` (a contraction's partial sums): a reduce-scatter along a dim the partitioner
    wants split over those axes, an all-reduce over the rest."""
    names = tuple(a for f in factors for a in axes.get(f, ()))
    for dim, factor in enumerate(dims):
        split = axes.get(SCATTER + factor, ())
        if split and set(split) <= set(names):
            x = jax.lax.psum_scatter(x, split, scatter_dimension=dim, tiled=True)
            names = tuple(a for a in names if a not in split)
    return jax.lax.psum(x, names) if names else x


# vmap helpers for the ops' batch rules.


def batch_size(args, dims) -> int:
    """The size of the vmapped axis (from the first batched operand)."""
    return next(a.shape[d] for a, d in zip(args, dims) if d is not None)


def to_front(x, d, size):
    """x with its vmapped axis `d` first (broadcast to `size` when unbatched: d is None)."""
    return jnp.broadcast_to(x, (size,) + x.shape) if d is None else jnp.moveaxis(x, d, 0)


def all_to_front(args, dims):
    """Every operand with its vmapped axis first, the unbatched ones broadcast to the batch."""
    size = batch_size(args, dims)
    return [to_front(a, d, size) for a, d in zip(args, dims)]


def fold_batch(x, d, size):
    """x (B, N, ...) folded into the op's own leading batch dim: (B*N, ...)."""
    x = to_front(x, d, size)
    return x.reshape((-1,) + x.shape[2:])


def constrain_output(out, out_sharding):
    """A result with `out_sharding`: Explicit mode types the primitive's result already (a
    reshard where a reshape or cast came after it); Auto mode constrains it."""
    if out_sharding is None:
        return out
    if _compat.explicit_axes(out_sharding.mesh, tuple(out_sharding.mesh.axis_names)):
        if jax.typeof(out).sharding.spec == out_sharding.spec:
            return out
        return jax.sharding.reshard(out, out_sharding)
    return jax.lax.with_sharding_constraint(out, out_sharding)


def canonical_out_sharding(out_sharding, who: str):
    """A NamedSharding from what `jnp.matmul` accepts as out_sharding (a NamedSharding, or a
    PartitionSpec resolved against the current mesh)."""
    if out_sharding is None or isinstance(out_sharding, NamedSharding):
        return out_sharding
    if isinstance(out_sharding, P):
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            raise ValueError(f"{who}: out_sharding={out_sharding} is a PartitionSpec, which needs a mesh "
                             "(jax.set_mesh); or pass a NamedSharding")
        return NamedSharding(mesh, out_sharding)
    raise TypeError(f"{who}: out_sharding must be a NamedSharding or a PartitionSpec, got {out_sharding!r}")
