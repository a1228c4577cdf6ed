"""jaxgemm.scaled_matmul sharded: jit in Auto mode (each layout's collectives counted in the
compiled HLO, K split only with its scales, a reduce-scatter where the result is wanted
split), Explicit mode (typed results, out_sharding) and shard_map."""

import jax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_scaled import _bound, _operands, _reference, _rel
from test_sharding import auto_mesh, collective_counts, compile_sharded, explicit_mesh

import jaxgemm

# Auto mode: (lhs, rhs, lhs_scales, rhs_scales) specs -> the result's spec and collectives.
# K splits over whole 128-blocks; a scale array split alone is gathered back (never wrong).
LAYOUTS = {
    "batch": ((P("x"), P("x"), P("x"), P("x")), P("x", None, None), {}),
    "rows (data parallel)": ((P(None, "x"), P(), P(None, "x"), P()), P(None, "x", None), {}),
    "columns (tensor parallel)": ((P(), P(None, "x"), P(), P(None, "x")), P(None, None, "x"), {}),
    "k blocks with their scales": ((P(None, None, "x"),) * 4, P(), {"all-reduce": 1}),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_auto_mode(name):
    specs, out_spec, collectives = LAYOUTS[name]
    args = _operands(7, 8, 64, 48, 1024, 8)
    out, hlo = compile_sharded(jaxgemm.scaled_matmul, auto_mesh((8,)), specs, args)
    assert _rel(out, _reference(*args)) <= _bound(args)
    counts = {k: v for k, v in collective_counts(hlo).items() if v}
    assert counts == collectives, hlo
    assert NamedSharding(out.sharding.mesh, out_spec).is_equivalent_to(out.sharding, 3), out.sharding


def test_auto_mode_rhs_scales_as_tiles():
    """rhs_scales one per 128-row tile (B, N / 128, KB), split with rhs's rows (tensor
    parallel, a tile a device): no collective, the values of the scales repeated per row."""
    lhs, rhs, ls, rs = _operands(10, 1, 32, 1024, 512, 4)
    tiles = rs[:, ::128]
    specs = (P(), P(None, "x"), P(), P(None, "x"))
    out, hlo = compile_sharded(jaxgemm.scaled_matmul, auto_mesh((8,)), specs, (lhs, rhs, ls, tiles))
    assert _rel(out, _reference(lhs, rhs, ls, jax.numpy.repeat(tiles, 128, axis=1))) <= _bound((lhs, rhs))
    assert not any(collective_counts(hlo).values()), hlo
    assert NamedSharding(out.sharding.mesh, P(None, None, "x")).is_equivalent_to(out.sharding, 3), out.sharding


def test_explicit_mode_rhs_scales_as_tiles():
    """The tiled rhs_scales split with rhs's rows in Explicit mode: the result typed split on
    its columns, the values right."""
    mesh = explicit_mesh((8,))
    lhs, rhs, ls, rs = _operands(14, 1, 32, 1024, 512, 4)
    tiles = rs[:, ::128]
    put = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))  # noqa: E731
    args = [put(x, s) for x, s in zip((lhs, rhs, ls, tiles), (P(), P(None, "x"), P(), P(None, "x")))]
    with jax.set_mesh(mesh):
        out = jax.jit(jaxgemm.scaled_matmul)(*args)
        assert jax.typeof(out).sharding.spec == P(None, None, "x")
    assert _rel(out, _reference(lhs, rhs, ls, jax.numpy.repeat(tiles, 128, axis=1))) <= _bound((lhs, rhs))


def test_shard_map_rhs_scales_as_tiles():
    """Inside shard_map each device holds its rows of rhs and their tiles' scales: its
    columns of the product, those scales repeated per row."""
    lhs, rhs, ls, rs = _operands(15, 1, 32, 1024, 512, 4)
    tiles = rs[:, ::128]
    specs = (P(), P(None, "x"), P(), P(None, "x"))
    out = jax.jit(jax.shard_map(jaxgemm.scaled_matmul, mesh=auto_mesh((8,)), in_specs=specs,
                                out_specs=P(None, None, "x")))(lhs, rhs, ls, tiles)  # fmt: skip
    assert _rel(out, _reference(lhs, rhs, ls, jax.numpy.repeat(tiles, 128, axis=1))) <= _bound((lhs, rhs))


def test_auto_mode_k_not_on_block_boundaries():
    """K split over 8 devices but only 4 blocks: the blocks stay whole (their operands
    gathered), the values right."""
    args = _operands(8, 1, 16, 16, 512, 4)
    specs = (P(None, None, "x"), P(None, None, "x"), P(), P())
    out, _ = compile_sharded(jaxgemm.scaled_matmul, auto_mesh((8,)), specs, args)
    assert _rel(out, _reference(*args)) <= _bound(args)


def test_explicit_mode():
    """Rows split: the result typed split the same way. K split in both operands: jnp's
    error asking for out_sharding; with out_sharding, that sharding and the right values."""
    mesh = explicit_mesh((8,))
    args = _operands(9, 1, 64, 32, 1024, 8)
    put = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))  # noqa: E731
    rows = [put(x, s) for x, s in zip(args, (P(None, "x"), P(), P(None, "x"), P()))]
    with jax.set_mesh(mesh):
        out = jax.jit(jaxgemm.scaled_matmul)(*rows)
        assert jax.typeof(out).sharding.spec == P(None, "x", None)
        assert _rel(out, _reference(*args)) <= _bound(args)
        ks = [put(x, P(None, None, "x")) for x in args]
        with pytest.raises(Exception, match="out_sharding"):
            jax.jit(jaxgemm.scaled_matmul)(*ks)
        out = jax.jit(lambda *a: jaxgemm.scaled_matmul(*a, out_sharding=P(None, "x", None)))(*ks)
        assert jax.typeof(out).sharding.spec == P(None, "x", None)
        assert _rel(out, _reference(*args)) <= _bound(args)


def test_k_split_wanted_split_on_rows_is_reduce_scattered():
    """K blocks split and the result wanted split on M over the same axis (a row-parallel
    layer feeding sequence parallelism): one reduce-scatter and nothing else."""
    mesh = auto_mesh((8,))
    args = _operands(11, 1, 64, 32, 1024, 8)
    k_split = NamedSharding(mesh, P(None, None, "x"))
    jitted = jax.jit(jaxgemm.scaled_matmul, in_shardings=(k_split,) * 4,
                     out_shardings=NamedSharding(mesh, P(None, "x", None)))  # fmt: skip
    out = jitted(*args)
    counts = {k: v for k, v in collective_counts(jitted.lower(*args).compile().as_text()).items() if v}
    assert counts == {"reduce-scatter": 1}, counts
    assert _rel(out, _reference(*args)) <= _bound(args)


def test_shard_map_k_blocks():
    """Inside shard_map (default checks) each device multiplies its K blocks with their
    scales; the psum of the partial products is the whole product."""
    mesh = auto_mesh((8,))
    args = _operands(12, 1, 16, 24, 1024, 8)
    local = lambda *a: jax.lax.psum(jaxgemm.scaled_matmul(*a), "x")  # noqa: E731
    out = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(None, None, "x"),) * 4, out_specs=P()))(*args)
    assert _rel(out, _reference(*args)) <= _bound(args)


@pytest.mark.parametrize("specs, collectives", [
    ((P(None, "x"), P(), P(None, "x"), P()), {}),  # rows: no collective
    ((P(None, None, "x"), P(None, None, "x"), P(), P()), {"all-reduce": 1}),  # K split, the scales whole
])  # fmt: skip
def test_auto_mode_one_block(specs, collectives):
    """Per-row scales (KB = 1, the fp8 kernel's case; this failed to lower when K was a
    compound dim with a factor of size 1): K splits anywhere, each device scaling its
    partial sums by the rows' scales, then one all-reduce (a data-parallel weight
    gradient's layout; no gather of the operands)."""
    args = _operands(13, 2, 64, 48, 512, 1)
    out, hlo = compile_sharded(jaxgemm.scaled_matmul, auto_mesh((8,)), specs, args)
    assert _rel(out, _reference(*args)) <= _bound(args)
    assert {k: v for k, v in collective_counts(hlo).items() if v} == collectives, hlo
