"""`jaxgemm.matmul`, `jaxgemm.dense` and `jaxgemm.conv2d` on sharded arrays, against the
same functions in jnp / lax under the same shardings:

- Auto mode (sharded jit): the values of one device; the collectives of the jnp version
  (no all-gather where jnp needs none); the output sharding jnp's gets; and jaxgemm's FFI
  calls run on the shards (their operands have per-shard sizes).
- Gradients of a data-parallel MLP step and of a Megatron tensor-parallel block.
- Explicit mode: output shardings in the types, an error asking for `out_sharding` where
  the contracting dim is sharded, and `out_sharding=` honoured.
- shard_map with check_vma (the default): forward and grad.
- Shardings that do not divide a dim: the right values or a clear error.

Needs 8 devices: tests/conftest.py asks XLA for 8 host CPU devices."""

import dataclasses
import math
import re
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding, reshard
from jax.sharding import PartitionSpec as P

# Written for 8 devices (conftest gives the CPU 8); with 2 or 4 (a GPU host) every mesh
# shrinks to fit (fit_mesh), so the same tests run on real GPUs.
if len(jax.devices()) < 2 or len(jax.devices()) & (len(jax.devices()) - 1):
    pytest.skip(f"needs 2, 4 or 8 devices, found {len(jax.devices())}", allow_module_level=True)

import jaxgemm  # noqa: E402

TOL = 1e-5  # relative Frobenius error, float32
HIGHEST = lax.Precision.HIGHEST
AXES = ("x", "y", "z")


# ---------------------------------------------------------------------------------------
# Helpers: meshes, data, errors, HLO.


def fit_mesh(shape):
    """`shape` with its leading axes halved until it fits the devices there are."""
    shape = list(shape)
    while int(np.prod(shape)) > min(8, len(jax.devices())):
        shape[next(i for i, d in enumerate(shape) if d > 1)] //= 2
    return tuple(shape)


def auto_mesh(shape, devices=None):
    shape = fit_mesh(shape)
    kw = {} if devices is None else dict(devices=devices[: int(np.prod(shape))])
    return jax.make_mesh(shape, AXES[: len(shape)], axis_types=(AxisType.Auto,) * len(shape), **kw)


def explicit_mesh(shape):
    shape = fit_mesh(shape)
    return jax.make_mesh(shape, AXES[: len(shape)], axis_types=(AxisType.Explicit,) * len(shape))


def random(seed, shape, scale=1.0):
    """Fresh standard normals (never zeros), times `scale`."""
    rng = np.random.default_rng(zlib.crc32(repr((seed, shape)).encode()))
    return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)


def rel_error(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert np.all(np.isfinite(out)), "non-finite values"
    denom = np.linalg.norm(ref)
    return np.linalg.norm(out - ref) / (denom if denom > 0 else 1.0)


def value_problems(out, ref, what="values"):
    """Per leaf: relative Frobenius error above TOL (as messages, not asserts)."""
    out_leaves, out_tree = jax.tree_util.tree_flatten(out)
    ref_leaves, ref_tree = jax.tree_util.tree_flatten(ref)
    if out_tree != ref_tree:
        return [f"{what}: tree {out_tree} != {ref_tree}"]
    problems = []
    for i, (o, r) in enumerate(zip(out_leaves, ref_leaves)):
        if np.shape(o) != np.shape(r):
            problems.append(f"{what}[{i}]: shape {np.shape(o)} != {np.shape(r)}")
            continue
        err = rel_error(o, r)
        if not err <= TOL:
            problems.append(f"{what}[{i}]: relative error {err:.2e} > {TOL}")
    return problems


def norm_spec(spec):
    """A PartitionSpec as a tuple without trailing Nones, 1-tuples of axes as the axis:
    P('x', None) == P('x') == P(('x',))."""
    entries = []
    for e in tuple(spec):
        if isinstance(e, (tuple, list)):
            e = tuple(e)
            e = e[0] if len(e) == 1 else (None if not e else e)
        entries.append(e)
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


def spec_of(sharding):
    spec = getattr(sharding, "spec", None)
    return None if spec is None else norm_spec(spec)


COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
# An HLO instruction's opcode is followed by "(" (names are followed by " =", "," or ")");
# async pairs count once, by their -start.
_COLLECTIVE_OP = re.compile(r"(?<![\w\-])(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(")


def reduced_elements(hlo: str) -> int:
    """How many elements the all-reduces sum, however XLA merges them (its GPU passes
    combine independent all-reduces; the CPU's do not)."""
    total = 0
    for line in hlo.splitlines():
        d = _DEF.match(line)
        op = d and re.search(r"(?<![\w\-])all-reduce(?:-start)?\(", d.group(2))
        if op:
            total += sum(math.prod(shape) for shape in _array_shapes(d.group(2)[: op.start()]))
    return total


def collective_counts(hlo: str) -> dict:
    counts = dict.fromkeys(COLLECTIVES, 0)
    for m in _COLLECTIVE_OP.finditer(hlo):
        counts[m.group(1)] += 1
    return counts


_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+)$")
_OPCODE = re.compile(r"(?<![\w%.\-\[,])([a-z][a-z0-9\-]*)\(")
_ARRAY = re.compile(r"\b(?:pred|bf16|[a-z]+\d+[a-z0-9]*)\[([0-9,]*)\]")


def _array_shapes(text):
    return [tuple(int(d) for d in m.group(1).split(",") if d) for m in _ARRAY.finditer(text)]


def _call_args(rest, start):
    """The text between the "(" ending at `start` and its matching ")"."""
    depth = 1
    for i in range(start, len(rest)):
        depth += {"(": 1, ")": -1}.get(rest[i], 0)
        if depth == 0:
            return rest[start:i]
    return rest[start:]


@dataclasses.dataclass
class CustomCall:
    target: str
    results: list
    operands: list


def jaxgemm_calls(hlo: str) -> list:
    """Every custom call whose target names jaxgemm, with its result and operand shapes
    (loosely parsed from the compiled HLO text)."""
    shapes, pending = {}, []
    for line in hlo.splitlines():
        m = _DEF.match(line)
        if not m:
            continue
        name, rest = m.groups()
        op = _OPCODE.search(rest)
        if not op:
            continue
        shapes[name] = _array_shapes(rest[: op.start()])
        if op.group(1) == "custom-call":
            target = re.search(r'custom_call_target="([^"]+)"', rest)
            if target and "jaxgemm" in target.group(1):
                pending.append((target.group(1), shapes[name], _call_args(rest, op.end())))
    calls = []
    for target, results, args in pending:
        inline = _array_shapes(args)  # operands printed with their shapes, if they are
        operands = inline or [s for n in re.findall(r"%([\w.\-]+)", args) for s in shapes.get(n, [])]
        calls.append(CustomCall(target, results, operands))
    return calls


def ffi_problems(hlo, inputs):
    """jaxgemm's FFI calls must take the inputs' shards, never a whole sharded input.
    `inputs`: (label, global shape, per-shard shape). A shard is found by its element
    count (reshapes such as folding a batch into M keep it), a whole input by its shape
    (another input's shard may have its count); inputs under 64 elements are skipped."""
    calls = jaxgemm_calls(hlo)
    if not calls:
        return ["no jaxgemm custom call in the compiled HLO"]
    sizes = {math.prod(s) for call in calls for s in call.operands}
    shapes = {tuple(s) for call in calls for s in call.operands}
    problems = []
    for label, whole, shard in inputs:
        if tuple(whole) == tuple(shard) or math.prod(whole) < 64:
            continue
        if tuple(whole) in shapes and math.prod(shard) not in sizes:
            problems.append(f"a jaxgemm FFI call takes {label} whole ({whole}), not its shard {shard}")
        elif math.prod(shard) not in sizes:
            problems.append(f"no jaxgemm FFI call takes {label}'s shard {shard} (operand sizes {sorted(sizes)})")
    return problems


def compile_sharded(f, mesh, specs, args):
    """jit with in_shardings; (outputs, compiled HLO text)."""
    shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))
    jitted = jax.jit(f, in_shardings=shardings)
    hlo = jitted.lower(*args).compile().as_text()
    return jitted(*args), hlo


def compare_sharded(ours, ref, mesh, specs, args, *, check_ffi=True):
    """Runs ours and ref under the same in_shardings; returns the list of ways ours differs
    (values vs ref on one device, collective counts, output shardings, FFI operand sizes),
    after asserting that ref itself matches its single-device values."""
    single = ref(*args)
    ref_out, ref_hlo = compile_sharded(ref, mesh, specs, args)
    assert not value_problems(ref_out, single), "the jnp side is wrong: test bug"
    out, hlo = compile_sharded(ours, mesh, specs, args)
    problems = value_problems(out, single)
    want, got = collective_counts(ref_hlo), collective_counts(hlo)
    if got != want:
        diff = {k: f"{got[k]} (jnp {want[k]})" for k in COLLECTIVES if got[k] != want[k]}
        problems.append(f"collectives differ from jnp's: {diff}")
    out_specs = [spec_of(o.sharding) for o in jax.tree_util.tree_leaves(out)]
    ref_specs = [spec_of(o.sharding) for o in jax.tree_util.tree_leaves(ref_out)]
    if out_specs != ref_specs:
        problems.append(f"output spec {out_specs} != jnp's {ref_specs}")
    if check_ffi:
        flat_args, flat_specs = jax.tree_util.tree_leaves(args), jax.tree_util.tree_leaves(
            specs, is_leaf=lambda s: isinstance(s, P)
        )
        inputs = [
            (f"input {i} sharded {s}", a.shape, NamedSharding(mesh, s).shard_shape(a.shape))
            for i, (a, s) in enumerate(zip(flat_args, flat_specs))
        ]
        problems += ffi_problems(hlo, inputs)
    return problems, ref_hlo


# ---------------------------------------------------------------------------------------
# The functions, jaxgemm and jnp / lax.


def mm_ref(a, b, bias=None, activation=None, transpose_b=False):
    z = jnp.matmul(a, jnp.swapaxes(b, -1, -2) if transpose_b else b, precision=HIGHEST)
    z = z if bias is None else z + bias
    return ACT[activation](z)


ACT = {
    None: lambda z: z,
    "relu": jax.nn.relu,
    "gelu": lambda z: jax.nn.gelu(z, approximate=True),
}


def conv_ref(x, w, bias=None, activation=None, stride=1, out_sharding=None):
    kw = {} if out_sharding is None else dict(out_sharding=out_sharding)
    z = lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                 precision=HIGHEST, **kw)  # fmt: skip
    return ACT[activation](z if bias is None else z + bias)


def _matmul(act=None, bias=False, transpose_b=False):
    if bias:
        ours = lambda a, b, c: jaxgemm.matmul(a, b, bias=c, activation=act, transpose_b=transpose_b)  # noqa: E731
        ref = lambda a, b, c: mm_ref(a, b, c, act, transpose_b)  # noqa: E731
    else:
        ours = lambda a, b: jaxgemm.matmul(a, b, activation=act, transpose_b=transpose_b)  # noqa: E731
        ref = lambda a, b: mm_ref(a, b, None, act, transpose_b)  # noqa: E731
    return ours, ref


def _dense(act):
    return (lambda x, w, b: jaxgemm.dense(x, w, b, activation=act)), (lambda x, w, b: mm_ref(x, w, b, act))


def _conv(act, stride=1):
    return (
        lambda x, w, b: jaxgemm.conv2d(x, w, bias=b, activation=act, stride=stride),
        lambda x, w, b: conv_ref(x, w, b, act, stride),
    )


def _vmapped(pair, in_axes):
    return tuple(jax.vmap(f, in_axes=in_axes) for f in pair)


@dataclasses.dataclass(frozen=True)
class Layout:
    name: str
    mesh: tuple
    fns: tuple  # (ours, ref)
    shapes: tuple
    specs: tuple
    scales: tuple = ()  # per input; weights get 1/sqrt(fan-in)


M, K, N = 16, 32, 24
CX, CW = (8, 6, 6, 8), (3, 3, 8, 16)  # conv x (N, H, W, C), w (R, S, C, K)
W_SCALE = 1 / math.sqrt(K)
CW_SCALE = 1 / math.sqrt(3 * 3 * 8)
CONV_SCALES = (1.0, CW_SCALE, 1.0)
S3 = (None, None, None)

LAYOUTS = [
    # mesh (8,): one axis.
    Layout("matmul_M", (8,), _matmul(), ((M, K), (K, N)), (P("x", None), P())),
    Layout("matmul_N", (8,), _matmul(), ((M, K), (K, N)), (P(), P(None, "x"))),
    Layout("matmul_K", (8,), _matmul(), ((M, K), (K, N)), (P(None, "x"), P("x", None))),
    Layout("matmul_N_transpose_b", (8,), _matmul(transpose_b=True), ((M, K), (N, K)), (P(), P("x", None))),
    Layout("matmul_batch", (8,), _matmul(), ((8, M, K), (8, K, N)), (P("x"), P("x"))),
    Layout("matmul_batch_broadcast_b", (8,), _matmul(), ((8, M, K), (K, N)), (P("x"), P())),
    Layout("matmul_M_bias_gelu", (8,), _matmul("gelu", True), ((M, K), (K, N), (N,)), (P("x", None), P(), P()),
           (1.0, W_SCALE, 1.0)),
    Layout("matmul_N_bias_relu", (8,), _matmul("relu", True), ((M, K), (K, N), (N,)), (P(), P(None, "x"), P("x")),
           (1.0, W_SCALE, 1.0)),
    Layout("matmul_K_bias_gelu", (8,), _matmul("gelu", True), ((M, K), (K, N), (N,)),
           (P(None, "x"), P("x", None), P()), (1.0, W_SCALE, 1.0)),
    Layout("dense_K_bias_gelu", (8,), _dense("gelu"), ((M, K), (K, N), (N,)), (P(None, "x"), P("x", None), P()),
           (1.0, W_SCALE, 1.0)),
    Layout("dense_batch_bias_gelu", (8,), _dense("gelu"), ((8, 2, K), (K, N), (N,)), (P("x"), P(), P()),
           (1.0, W_SCALE, 1.0)),
    Layout("vmap_matmul", (8,), _vmapped(_matmul(), (0, 0)), ((8, M, K), (8, K, N)), (P("x"), P("x"))),
    Layout("vmap_matmul_bias_gelu", (8,), _vmapped(_matmul("gelu", True), (0, 0, None)),
           ((8, M, K), (8, K, N), (N,)), (P("x"), P("x"), P()), (1.0, W_SCALE, 1.0)),
    Layout("conv_batch", (8,), _conv("relu"), (CX, CW, (16,)), (P("x"), P(), P()), CONV_SCALES),
    Layout("conv_out_channels", (8,), _conv("relu"), (CX, CW, (16,)), (P(), P(*S3, "x"), P("x")), CONV_SCALES),
    Layout("conv_in_channels", (8,), _conv("relu"), (CX, CW, (16,)), (P(*S3, "x"), P(None, None, "x", None), P()),
           CONV_SCALES),
    Layout("conv_batch_stride2", (8,), _conv("gelu", 2), (CX, CW, (16,)), (P("x"), P(), P()), CONV_SCALES),
    # mesh (4, 2).
    Layout("matmul_MN", (4, 2), _matmul(), ((M, K), (K, N)), (P("x", None), P(None, "y"))),
    Layout("matmul_MK", (4, 2), _matmul(), ((M, K), (K, N)), (P("x", "y"), P("y", None))),
    Layout("matmul_M_two_axes", (4, 2), _matmul(), ((M, K), (K, N)), (P(("x", "y"), None), P())),
    Layout("dense_MK_bias_gelu", (4, 2), _dense("gelu"), ((M, K), (K, N), (N,)), (P("x", "y"), P("y", None), P()),
           (1.0, W_SCALE, 1.0)),
    Layout("conv_batch_out_channels", (4, 2), _conv("relu"), (CX, CW, (16,)), (P("x"), P(*S3, "y"), P("y")),
           CONV_SCALES),
    Layout("conv_batch_in_channels", (4, 2), _conv("relu"), (CX, CW, (16,)),
           (P("x", None, None, "y"), P(None, None, "y", None), P()), CONV_SCALES),
    # mesh (2, 2, 2).
    Layout("matmul_batch_MN", (2, 2, 2), _matmul(), ((2, M, K), (2, K, N)), (P("x", "y", None), P("x", None, "z"))),
    Layout("matmul_batch_MK", (2, 2, 2), _matmul(), ((2, M, K), (2, K, N)), (P("x", "y", "z"), P("x", "z", None))),
    Layout("conv_batch_in_out_channels", (2, 2, 2), _conv("relu"), (CX, CW, (16,)),
           (P("x", None, None, "z"), P(None, None, "z", "y"), P("y")), CONV_SCALES),
]  # fmt: skip


def _inputs(layout):
    scales = layout.scales or (1.0,) * len(layout.shapes)
    return tuple(random((layout.name, i), s, sc) for i, (s, sc) in enumerate(zip(layout.shapes, scales)))


@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout.name for layout in LAYOUTS])
def test_auto_mode(layout):
    """Values, collectives, output sharding and per-shard FFI operands under a sharded jit."""
    ours, ref = layout.fns
    problems, ref_hlo = compare_sharded(ours, ref, auto_mesh(layout.mesh), layout.specs, _inputs(layout))
    # jnp gathers nothing in any of these layouts (M, N, batch and output-channel shardings
    # need no communication, a sharded contracting dim one all-reduce): neither may ours.
    assert collective_counts(ref_hlo)["all-gather"] == 0, "jnp all-gathers: test bug"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("mode", ["auto", "explicit", "shard_map"])
def test_few_channel_conv_batch_sharded(mode):
    """A 16-bit first layer (C = 2: the forward and weight gradient are GEMMs of window
    columns) with its images split, by a sharded jit in Auto and Explicit mode and inside
    shard_map (default checks): the loss and the weight and bias gradients as on one device,
    no all-gather, and no more elements all-reduced than jnp's (the weight and bias gradients)."""
    x = random("fc_x", (8, 9, 9, 2)).astype(jnp.bfloat16)
    w = random("fc_w", (3, 3, 2, 16), 1 / math.sqrt(18)).astype(jnp.bfloat16)
    b = random("fc_b", (16,)).astype(jnp.bfloat16)
    ours = lambda x, w, b: jaxgemm.conv2d(x, w, bias=b, activation="relu")  # noqa: E731
    ref = lambda x, w, b: conv_ref(*(a.astype(jnp.float32) for a in (x, w, b)), "relu")  # noqa: E731

    def loss(conv, mesh=None):
        if mode != "shard_map":
            return jax.value_and_grad(lambda x, w, b: jnp.sum(conv(x, w, b).astype(jnp.float32) ** 2), argnums=(1, 2))
        local = lambda x, w, b: lax.psum(jnp.sum(conv(x, w, b).astype(jnp.float32) ** 2), "x")  # noqa: E731
        sharded = jax.shard_map(local, mesh=mesh, in_specs=(P("x"), P(), P()), out_specs=P())
        return jax.value_and_grad(sharded, argnums=(1, 2))

    mesh, specs = auto_mesh((8,)), (P("x"), P(), P())
    want = loss(ref, mesh)(x, w, b)
    # (jnp's collectives from Auto mode: in Explicit mode lax.conv's weight gradient asks
    # for an out_sharding, JAX 0.10)
    _, ref_hlo = compile_sharded(loss(ref, mesh), mesh, specs, (x, w, b))
    if mode == "explicit":
        with jax.set_mesh(explicit_mesh((8,))):
            xs = jax.device_put(x, P("x"))
            out = jax.jit(loss(ours))(xs, w, b)
            hlo = jax.jit(loss(ours)).lower(xs, w, b).compile().as_text()
    else:
        out, hlo = compile_sharded(loss(ours, mesh), mesh, specs, (x, w, b))
    for got, exp in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(want)):
        assert rel_error(got, exp) <= 1e-2
    kernels = set(re.findall(r'custom_call_target="(jaxgemm_\w+)"', hlo))
    assert "jaxgemm_gemm" in kernels and "jaxgemm_conv" not in kernels, kernels
    counts, ref_counts = collective_counts(hlo), collective_counts(ref_hlo)
    assert counts["all-gather"] == 0 and counts["all-reduce"] > 0, counts
    assert reduced_elements(hlo) <= reduced_elements(ref_hlo), (counts, ref_counts)


def test_auto_mode_device_put_and_set_mesh():
    """Arrays placed with device_put under jax.set_mesh and a plain jit (no in_shardings)."""
    mesh = auto_mesh((8,))
    a, b = random("dp_a", (M, K)), random("dp_b", (K, N), W_SCALE)
    bias = random("dp_bias", (N,))
    single = mm_ref(a, b, bias, "gelu")
    with jax.set_mesh(mesh):
        a_s = jax.device_put(a, NamedSharding(mesh, P("x", None)))
        ref_out = jax.jit(lambda a, b, c: mm_ref(a, b, c, "gelu"))(a_s, b, bias)
        out = jax.jit(lambda a, b, c: jaxgemm.matmul(a, b, bias=c, activation="gelu"))(a_s, b, bias)
        hlo = jax.jit(lambda a, b, c: jaxgemm.matmul(a, b, bias=c, activation="gelu")).lower(a_s, b, bias).compile()
    assert not value_problems(ref_out, single) and spec_of(ref_out.sharding) == ("x",)
    problems = value_problems(out, single)
    if spec_of(out.sharding) != spec_of(ref_out.sharding):
        problems.append(f"output spec {spec_of(out.sharding)} != jnp's {spec_of(ref_out.sharding)}")
    if collective_counts(hlo.as_text())["all-gather"]:
        problems.append("all-gather present")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------
# Gradients of training steps (Auto mode).


def _mlp_loss(dense):
    def loss(params, x, y):
        w1, b1, w2, b2 = params
        h = dense(x, w1, b1, "gelu")
        out = dense(h, w2, b2, None)
        return jnp.mean((out - y) ** 2)

    return loss


OUR_DENSE = lambda x, w, b, act: jaxgemm.dense(x, w, b, activation=act)  # noqa: E731
REF_DENSE = lambda x, w, b, act: mm_ref(x, w, b, act)  # noqa: E731

TRAINING = {
    # Data parallel: the batch sharded, parameters replicated (one all-reduce of the grads).
    "data_parallel": ((8,), ((P(), P(), P(), P()), P("x"), P("x"))),
    # Megatron: w1 by columns, b1 with them, w2 by rows; x replicated.
    "megatron": ((8,), ((P(None, "x"), P("x"), P("x", None), P()), P(), P())),
    # Both: the batch on x, Megatron on y.
    "data_and_megatron": ((4, 2), ((P(None, "y"), P("y"), P("y", None), P()), P("x"), P("x"))),
}


@pytest.mark.parametrize("name", list(TRAINING))
def test_training_step_grad(name):
    mesh_shape, specs = TRAINING[name]
    hidden = 32
    params = (
        random("w1", (K, hidden), W_SCALE),
        random("b1", (hidden,)),
        random("w2", (hidden, 8), 1 / math.sqrt(hidden)),
        random("b2", (8,)),
    )
    x, y = random("x", (M, K)), random("y", (M, 8))
    ours = jax.value_and_grad(_mlp_loss(OUR_DENSE))
    ref = jax.value_and_grad(_mlp_loss(REF_DENSE))
    problems, ref_hlo = compare_sharded(ours, ref, auto_mesh(mesh_shape), specs, (params, x, y), check_ffi=False)
    assert collective_counts(ref_hlo)["all-gather"] == 0, "jnp all-gathers: test bug"
    assert not problems, "\n".join(problems)


def _sm_margins(hlo: str) -> list[tuple[str, int | None]]:
    """(target, sm_margin or None) of each jaxgemm GEMM or conv custom call in the HLO text."""
    calls = []
    for line in hlo.splitlines():
        target = re.search(r'custom_call_target="(jaxgemm_(?:gemm|conv))"', line)
        if target:
            margin = re.search(r"sm_margin = (\d+)", line)
            calls.append((target.group(1), int(margin.group(1)) if margin else None))
    return calls


def _dynamic_tiles(hlo: str) -> list[bool]:
    """The dynamic_tiles attribute of each jaxgemm GEMM call in the HLO text."""
    calls = [line for line in hlo.splitlines() if 'custom_call_target="jaxgemm_gemm"' in line]
    return [re.search(r"dynamic_tiles = (true|false)", line).group(1) == "true" for line in calls]


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the SM margin is a CUDA kernel option")
@pytest.mark.parametrize("name, margins, dynamic", [("data_parallel", 2, 0), ("megatron", 0, 2)])
def test_weight_gradients_make_room_for_all_reduce(name, margins, dynamic):
    """Data parallel: the two weight gradients, whose partial sums are all-reduced, leave
    SMs free for the other layer's all-reduce. Megatron sums activations: its two weight
    gradients (hidden units sharded) take their tiles from a counter instead, so that an
    input gradient's all-reduce beside them delays none of their tiles."""
    mesh_shape, specs = TRAINING[name]
    params = (random("w1", (K, 32)), random("b1", (32,)), random("w2", (32, 8)), random("b2", (8,)))
    args = (params, random("x", (M, K)), random("y", (M, 8)))
    _, hlo = compile_sharded(jax.grad(_mlp_loss(OUR_DENSE)), auto_mesh(mesh_shape), specs, args)
    found = _sm_margins(hlo)
    assert found and all(m is not None for _, m in found), f"every GEMM call has the attribute: {found}"
    assert sum(m > 0 for _, m in found) == margins, found
    assert sum(_dynamic_tiles(hlo)) == dynamic, hlo


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the SM margin is a CUDA kernel option")
def test_conv_weight_gradient_leaves_sms_for_all_reduce():
    """Images split (data parallel): the conv weight gradient, whose partial sums are
    all-reduced, leaves SMs free; the forward and input-gradient convs keep every SM."""
    x, w = random("x", CX), random("w", CW) * CW_SCALE
    loss = lambda x, w: jnp.sum(jaxgemm.conv2d(x, w, activation="relu") ** 2)  # noqa: E731
    _, hlo = compile_sharded(jax.grad(loss, argnums=(0, 1)), auto_mesh((8,)), (P("x"), P()), (x, w))
    found = _sm_margins(hlo)
    convs = [m for target, m in found if target == "jaxgemm_conv"]
    assert len(convs) >= 2 and None not in convs, f"every conv call has the attribute: {found}"
    # The input gradient may run as a GEMM (jaxgemm_gemm); only the weight gradient sums.
    assert sum(m > 0 for _, m in found if m is not None) == 1, found
    assert max(convs) > 0, f"the margin is on the conv weight gradient: {found}"


# ---------------------------------------------------------------------------------------
# Explicit mode: shardings in the types.

EXPLICIT = {
    # name: (ours, ref, shapes, in specs), on a (4, 2) mesh
    "matmul_M": (*_matmul(), ((M, K), (K, N)), (P("x", None), P())),
    "matmul_N": (*_matmul(), ((M, K), (K, N)), (P(), P(None, "y"))),
    "matmul_MN": (*_matmul(), ((M, K), (K, N)), (P("x", None), P(None, "y"))),
    "matmul_batch": (*_matmul(), ((4, M, K), (4, K, N)), (P("x"), P("x"))),
    "matmul_batch_M_broadcast_b": (*_matmul(), ((4, M, K), (K, N)), (P("x", "y"), P())),
    "matmul_M_bias_gelu": (*_matmul("gelu", True), ((M, K), (K, N), (N,)), (P("x", None), P(), P())),
    "dense_batch_bias_gelu": (*_dense("gelu"), ((M, K), (K, N), (N,)), (P("x"), P(), P())),
    "dense_N_bias_relu": (*_dense("relu"), ((M, K), (K, N), (N,)), (P(), P(None, "y"), P("y"))),
    "conv_batch": (*_conv("relu"), (CX, CW, (16,)), (P("x"), P(), P())),
}


def _explicit_inputs(name, shapes, specs):
    return tuple(jax.device_put(random((name, i), s), sp) for i, (s, sp) in enumerate(zip(shapes, specs)))


@pytest.mark.parametrize("name", list(EXPLICIT))
def test_explicit_mode_output_type(name):
    """jax.typeof(ours(...)).sharding.spec is what jnp's is: eagerly, under jit, and on
    arrays resharded inside the jit."""
    ours, ref, shapes, specs = EXPLICIT[name]
    single = ref(*(random((name, i), s) for i, s in enumerate(shapes)))
    with jax.set_mesh(explicit_mesh((4, 2))):
        args = _explicit_inputs(name, shapes, specs)
        ref_out = ref(*args)
        want = norm_spec(jax.typeof(ref_out).sharding.spec)
        assert not value_problems(ref_out, single), "the jnp side is wrong: test bug"
        # Also placed by reshard inside the jit, from replicated arrays.
        replicated = tuple(jax.device_put(a, P()) for a in args)
        resharded = jax.jit(lambda *a: ours(*(reshard(x, s) for x, s in zip(a, specs))))
        problems = []
        for how, f, inputs in [("eager", ours, args), ("jit", jax.jit(ours), args), ("reshard", resharded, replicated)]:
            out = f(*inputs)
            got = norm_spec(jax.typeof(out).sharding.spec)
            if got != want:
                problems.append(f"{how}: typeof spec {got} != jnp's {want}")
            problems += value_problems(out, single, how)
    assert not problems, "\n".join(problems)


UNSHARDED_WEIGHT = {
    "dense_bias_gelu": (*_dense("gelu"), ((M, K), (K, N), (N,)), P("x", None)),
    "conv_relu": (*_conv("relu"), (CX, CW, (16,)), P("x")),
}


@pytest.mark.parametrize("name", list(UNSHARDED_WEIGHT))
def test_explicit_mode_grad_of_unsharded_weight(name):
    """The batch sharded, the weight and bias on no mesh (as most code holds them): their
    gradients come back replicated, with one device's values, as jnp.matmul's do (the
    weight gradient's contraction is sharded in both operands; its type is the primal's).
    (lax.conv_general_dilated's own gradient raises here in JAX 0.10.)"""
    ours, ref, shapes, x_spec = UNSHARDED_WEIGHT[name]
    x, w, b = (random((name, i), s) for i, s in enumerate(shapes))

    def grads(f, x):
        return jax.jit(jax.grad(lambda w, b: jnp.sum(f(x, w, b) ** 2), argnums=(0, 1)))(w, b)

    single = grads(ref, x)
    with jax.set_mesh(explicit_mesh((8,))):
        got = grads(ours, jax.device_put(x, x_spec))
    assert [norm_spec(jax.typeof(g).sharding.spec) for g in got] == [(), ()]
    problems = value_problems(got, single)
    assert not problems, "\n".join(problems)


CONTRACTING = {
    "matmul_K": (*_matmul(), ((M, K), (K, N)), (P(None, "x"), P("x", None))),
    "dense_K_bias_gelu": (*_dense("gelu"), ((M, K), (K, N), (N,)), (P(None, "x"), P("x", None), P())),
    "conv_in_channels": (*_conv("relu"), (CX, CW, (16,)), (P(*S3, "x"), P(None, None, "x", None), P())),
}


@pytest.mark.parametrize("name", list(CONTRACTING))
def test_explicit_mode_contracting_dim_needs_out_sharding(name):
    """A sharded contracting dim leaves the output sharding ambiguous: like jnp.matmul /
    lax.conv, raise an error that asks for `out_sharding`."""
    ours, ref, shapes, specs = CONTRACTING[name]
    with jax.set_mesh(explicit_mesh((4, 2))):
        args = _explicit_inputs(name, shapes, specs)
        with pytest.raises(Exception, match="out_sharding"):
            ref(*args)
        with pytest.raises(Exception, match="out_sharding"):
            ours(*args)


OUT_SHARDING = {
    # name: (ours(out_sharding), ref(out_sharding), shapes, in specs, requested out spec)
    "matmul_K_to_M": (
        lambda s: lambda a, b: jaxgemm.matmul(a, b, out_sharding=s),
        lambda s: lambda a, b: jnp.matmul(a, b, precision=HIGHEST, out_sharding=s),
        ((M, K), (K, N)), (P(None, "x"), P("x", None)), P("x", None),
    ),
    "matmul_K_to_replicated": (
        lambda s: lambda a, b: jaxgemm.matmul(a, b, out_sharding=s),
        lambda s: lambda a, b: jnp.matmul(a, b, precision=HIGHEST, out_sharding=s),
        ((M, K), (K, N)), (P(None, "x"), P("x", None)), P(),
    ),
    "matmul_M_to_N": (
        lambda s: lambda a, b: jaxgemm.matmul(a, b, out_sharding=s),
        lambda s: lambda a, b: jnp.matmul(a, b, precision=HIGHEST, out_sharding=s),
        ((M, K), (K, N)), (P("x", None), P()), P(None, "y"),
    ),
    "matmul_K_bias_gelu_to_M": (
        lambda s: lambda a, b, c: jaxgemm.matmul(a, b, bias=c, activation="gelu", out_sharding=s),
        lambda s: lambda a, b, c: jax.nn.gelu(jnp.matmul(a, b, precision=HIGHEST, out_sharding=s) + c),
        ((M, K), (K, N), (N,)), (P(None, "x"), P("x", None), P()), P("x", None),
    ),
    "dense_K_bias_gelu_to_M": (
        lambda s: lambda x, w, b: jaxgemm.dense(x, w, b, activation="gelu", out_sharding=s),
        lambda s: lambda x, w, b: jax.nn.gelu(jnp.matmul(x, w, precision=HIGHEST, out_sharding=s) + b),
        ((M, K), (K, N), (N,)), (P(None, "x"), P("x", None), P()), P("x", None),
    ),
    "conv_in_channels_to_batch": (
        lambda s: lambda x, w, b: jaxgemm.conv2d(x, w, bias=b, activation="relu", out_sharding=s),
        lambda s: lambda x, w, b: conv_ref(x, w, b, "relu", out_sharding=s),
        (CX, CW, (16,)), (P(*S3, "x"), P(None, None, "x", None), P()), P("x"),
    ),
    "conv_batch_to_out_channels": (
        lambda s: lambda x, w, b: jaxgemm.conv2d(x, w, bias=b, out_sharding=s),
        lambda s: lambda x, w, b: conv_ref(x, w, b, out_sharding=s),
        (CX, CW, (16,)), (P("x"), P(), P()), P(*S3, "y"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(OUT_SHARDING))
def test_explicit_mode_out_sharding(name):
    """`out_sharding=` is honoured (in the type and the array) with the right values."""
    make_ours, make_ref, shapes, specs, requested = OUT_SHARDING[name]
    single = make_ref(None)(*(random((name, i), s) for i, s in enumerate(shapes)))
    with jax.set_mesh(explicit_mesh((4, 2))):
        args = _explicit_inputs(name, shapes, specs)
        ref_out = make_ref(requested)(*args)
        assert norm_spec(jax.typeof(ref_out).sharding.spec) == norm_spec(requested), "jnp: test bug"
        assert not value_problems(ref_out, single), "the jnp side is wrong: test bug"
        out = jax.jit(make_ours(requested))(*args)
        problems = value_problems(out, single)
        got = norm_spec(jax.typeof(out).sharding.spec)
        if got != norm_spec(requested):
            problems.append(f"typeof spec {got} != requested {norm_spec(requested)}")
        if spec_of(out.sharding) != norm_spec(requested):
            problems.append(f"array sharding {spec_of(out.sharding)} != requested {norm_spec(requested)}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------
# shard_map (check_vma=True, the default).


def _shard_map_step(layer, mesh):
    """loss(w, b, x, y) = sum over devices of the local squared error, x and y sharded on
    the batch, w and b replicated; the psum is inside the shard_map."""

    def local(w, b, x, y):
        return lax.psum(jnp.sum((layer(x, w, b) - y) ** 2), "x")

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P("x"), P("x")), out_specs=P())


SHARD_MAP = {
    "dense_bias_gelu": (
        lambda x, w, b: jaxgemm.dense(x, w, b, activation="gelu"),
        lambda x, w, b: mm_ref(x, w, b, "gelu"),
        ((K, N), (N,), (M, K), (M, N)), (W_SCALE, 1.0, 1.0, 1.0),
    ),
    "conv_bias_relu": (
        lambda x, w, b: jaxgemm.conv2d(x, w, bias=b, activation="relu"),
        lambda x, w, b: conv_ref(x, w, b, "relu"),
        (CW, (16,), CX, (8, 6, 6, 16)), (CW_SCALE, 1.0, 1.0, 1.0),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(SHARD_MAP))
def test_shard_map_forward_and_grad(name):
    ours, ref, shapes, scales = SHARD_MAP[name]
    w, b, x, y = (random((name, i), s, sc) for i, (s, sc) in enumerate(zip(shapes, scales)))
    mesh = auto_mesh((8,))

    def unsharded(w, b, x, y):
        return jnp.sum((ref(x, w, b) - y) ** 2)

    want = jax.value_and_grad(unsharded, argnums=(0, 1, 2))(w, b, x, y)
    ref_step = jax.value_and_grad(_shard_map_step(ref, mesh), argnums=(0, 1, 2))
    assert not value_problems(jax.jit(ref_step)(w, b, x, y), want), "the jnp side is wrong: test bug"
    problems = []
    fwd = jax.jit(_shard_map_step(ours, mesh))(w, b, x, y)
    problems += value_problems(fwd, want[0], "forward")
    step = jax.jit(jax.value_and_grad(_shard_map_step(ours, mesh), argnums=(0, 1, 2)))
    problems += value_problems(step(w, b, x, y), want, "value_and_grad")
    assert not problems, "\n".join(problems)


def test_shard_map_forward_sharded_output():
    """A shard_mapped matmul with a sharded output (no psum) and its grad."""
    mesh = auto_mesh((8,))
    a, b = random("sm_a", (M, K)), random("sm_b", (K, N), W_SCALE)

    def step(f):
        g = jax.shard_map(f, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"))
        return jax.jit(jax.value_and_grad(lambda a, b: jnp.sum(jnp.sin(g(a, b))), argnums=(0, 1)))

    want = step(lambda a, b: mm_ref(a, b))(a, b)
    unsharded = jax.value_and_grad(lambda a, b: jnp.sum(jnp.sin(mm_ref(a, b))), argnums=(0, 1))(a, b)
    assert not value_problems(want, unsharded), "the jnp side is wrong: test bug"
    problems = value_problems(step(jaxgemm.matmul)(a, b), want)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "bias_gelu_residual"])
def test_sequence_parallel_output_is_reduce_scattered(fused):
    """K sharded and the output wanted sharded on M over the same axis (a row-parallel layer
    feeding sequence parallelism): the partial products are reduce-scattered, not
    all-reduced then sliced, and bias, activation and residual act on each device's rows."""
    mesh = auto_mesh((8,))
    a, b, bias, res = random("sp_a", (M, K)), random("sp_b", (K, N)), random("sp_bias", (N,)), random("sp_r", (M, N))
    if fused:
        ours = lambda a, b, r: jaxgemm.matmul(a, b, bias=bias, activation="gelu", residual=r)  # noqa: E731
        ref = lambda a, b, r: mm_ref(a, b, bias, "gelu") + r  # noqa: E731
    else:
        ours = lambda a, b, r: jaxgemm.matmul(a, b)  # noqa: E731
        ref = lambda a, b, r: mm_ref(a, b)  # noqa: E731
    rows = NamedSharding(mesh, P("x", None))
    in_shardings = (NamedSharding(mesh, P(None, "x")), NamedSharding(mesh, P("x", None)), rows)
    jitted = jax.jit(ours, in_shardings=in_shardings, out_shardings=rows)
    out = jitted(a, b, res)
    counts = collective_counts(jitted.lower(a, b, res).compile().as_text())
    problems = value_problems(out, ref(a, b, res))
    if (counts["reduce-scatter"], counts["all-reduce"], counts["all-gather"]) != (1, 0, 0):
        problems.append(f"want one reduce-scatter and nothing else, got {counts}")
    if spec_of(out.sharding) != norm_spec(P("x", None)):
        problems.append(f"output sharded {spec_of(out.sharding)}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------
# Shardings that do not divide a dim.

_CLEAR = re.compile(r"(?i)divis|divid|evenly|uneven|multiple of")

UNEVEN = {
    # name: (ours, ref, shapes, spec of each input inside the jit), on a 4-device axis
    "matmul_M6": (*_matmul(), ((6, K), (K, N)), (P("x", None), P())),
    "matmul_K30": (*_matmul(), ((M, 30), (30, N)), (P(None, "x"), P("x", None))),
    "dense_N6_bias_gelu": (*_dense("gelu"), ((M, K), (K, 6), (6,)), (P(), P(None, "x"), P("x"))),
    "conv_batch6": (*_conv("relu"), ((6, 6, 6, 8), CW, (16,)), (P("x"), P(), P())),
}


@pytest.mark.parametrize("name", list(UNEVEN))
def test_uneven_sharding(name):
    """A mesh axis of 4 over a dim it does not divide: jax refuses such in_shardings, so the
    shardings are constrained inside the jit. jaxgemm must give the right values or an
    error that says what does not divide."""
    if len(jax.devices()) < 4:
        pytest.skip("the uneven dims are even on fewer than 4 devices")
    ours, ref, shapes, specs = UNEVEN[name]
    mesh = auto_mesh((4,), jax.devices()[:4])
    args = tuple(random((name, i), s) for i, s in enumerate(shapes))
    single = ref(*args)

    def constrained(f):
        def g(*args):
            args = [lax.with_sharding_constraint(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]
            return f(*args)

        return jax.jit(g)

    with pytest.raises(ValueError, match="divide"):  # jax itself refuses uneven in_shardings
        jax.jit(ref, in_shardings=tuple(NamedSharding(mesh, s) for s in specs))(*args)
    assert not value_problems(constrained(ref)(*args), single), "the jnp side is wrong: test bug"
    try:
        out = constrained(ours)(*args)
    except Exception as e:  # noqa: BLE001
        assert _CLEAR.search(str(e)), f"unclear error for an uneven sharding: {type(e).__name__}: {e}"
        return
    problems = value_problems(out, single)
    assert not problems, "\n".join(problems)
