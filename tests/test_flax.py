"""`jaxgemm.flax.Linear` / `Conv` against `flax.nnx.Linear` / `Conv`: the same constructor
arguments, parameters (names, shapes, dtypes, values for the same rngs), outputs and
gradients, state moving both ways, the NNX transforms (jit, grad, vmap, scan, remat), an
optax training step, and data parallelism under an Explicit mesh."""

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")
jf = pytest.importorskip("jaxgemm.flax")

F32, BF16 = jnp.float32, jnp.bfloat16
GELU_EXACT = functools.partial(jax.nn.gelu, approximate=False)
# The fused activation applied after the nnx layer, as the reference.
_REFERENCE_ACT = {
    None: lambda y: y,
    "relu": jax.nn.relu,
    "gelu": jax.nn.gelu,
    "gelu_exact": GELU_EXACT,
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
}
# A nonzero bias initializer, so that the bias is tested (the default is zeros).
BIAS_INIT = nnx.initializers.uniform(1.0)

CURRENT_SCALINGS = ("rowwise", "blockwise")  # (scaling="delayed" takes a history: test_fp8_delayed.py)


def KERNEL_INIT(key, shape, dtype=jnp.float32):
    """Uniform with lecun_normal's variance, drawn flat: random arrays of rank 4 take
    seconds each to compile on a CPU (jax's partitionable threefry), so only the first
    case of each layer and the layers of a small model use flax's default initializer."""
    bound = float(np.sqrt(3.0 / np.prod(shape[:-1])))
    return jax.random.uniform(key, (int(np.prod(shape)),), dtype, -bound, bound).reshape(shape)


@pytest.fixture(autouse=True)
def _exact_float32_references():
    """The nnx references in exact float32, as jaxgemm's float32 is: on a GPU, XLA's default
    precision multiplies float32 in tf32 (about 1e-3 off), which no float32 tolerance admits."""
    with jax.default_matmul_precision("float32"):
        yield


def _act_fn(activation):
    if activation is None or isinstance(activation, str):
        return _REFERENCE_ACT[activation]
    return activation


def _rel(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _tol(dtype):
    return 1e-2 if jnp.dtype(dtype) == jnp.bfloat16 else 1e-5


def _flat(state):
    return dict(nnx.to_flat_state(state))


def _assert_same_params(ours, theirs):
    a, b = _flat(nnx.state(ours, nnx.Param)), _flat(nnx.state(theirs, nnx.Param))
    assert a.keys() == b.keys()
    for key in a:
        assert type(a[key]) is type(b[key]), key
        va, vb = a[key][...], b[key][...]
        assert va.shape == vb.shape and va.dtype == vb.dtype, key
        np.testing.assert_array_equal(np.asarray(va, np.float32), np.asarray(vb, np.float32), err_msg=str(key))


def _assert_close_trees(got, want, tol):
    got, want = _flat(got), _flat(want)
    assert got.keys() == want.keys()
    for key in got:
        g, w = got[key][...], want[key][...]
        assert g.shape == w.shape and g.dtype == w.dtype, key
        assert _rel(g, w) <= tol, (key, _rel(g, w))


def _identity(y):
    return y


def _loss_and_output(model, x, act):
    """(<act(model(x)), ct> in float32 for a fixed cotangent ct, act(model(x))): act is the
    reference's fused part."""
    y = act(model(x))
    ct = jnp.cos(0.7 * jnp.arange(y.size, dtype=jnp.float32)).reshape(y.shape)
    return jnp.sum(y.astype(jnp.float32) * ct), y


# One compiled function for values and gradients (parameters and input) of every layer: a
# layer with the same structure (a round trip's, another seed's) reuses its executable.
_value_and_grad = nnx.jit(nnx.value_and_grad(_loss_and_output, argnums=(0, 1), has_aux=True), static_argnums=2)


_forward = nnx.jit(lambda model, x, act: act(model(x)), static_argnums=2)


def _run(model, x, act=_identity):
    (_, y), (grads, dx) = _value_and_grad(model, x, act)
    return y, grads, dx


def _round(a, dtype):
    """a rounded to dtype, as float32 (in numpy: no compilation)."""
    return jnp.asarray(np.asarray(a).astype(dtype).astype(np.float32))


def _reference(theirs, compute_dtype):
    """`theirs` computing in float32 on its parameters rounded to `compute_dtype`: for
    float32 the nnx layer itself; for bfloat16 the exact result of the rounded inputs, which
    nnx's own bfloat16 computation misses by about as much as ours (its output is rounded
    twice, its bias gradient summed in bfloat16)."""
    ref = nnx.clone(theirs)
    ref.dtype, ref.preferred_element_type = jnp.float32, None
    rounded = jax.tree.map(lambda a: _round(a, compute_dtype), nnx.state(theirs, nnx.Param))
    nnx.update(ref, rounded)
    return ref


def _compare(ours, theirs, x, act, compute_dtype):
    """Values, parameter and input gradients of ours(x) against act(theirs(x)), under nnx.jit:
    the dtypes nnx gives (outputs in the compute dtype, gradients in the parameters' and the
    input's), values within the compute dtype's tolerance."""
    tol = _tol(compute_dtype)
    got, g_ours, dx_ours = _run(ours, x)
    want, g_ref, dx_ref = _run(_reference(theirs, compute_dtype), _round(x, compute_dtype), act)
    assert got.shape == want.shape and got.dtype == jnp.dtype(compute_dtype)
    assert _rel(got, want) <= tol, _rel(got, want)
    g_ours, g_ref, params = _flat(g_ours), _flat(g_ref), _flat(nnx.state(theirs, nnx.Param))
    assert g_ours.keys() == g_ref.keys() == params.keys()
    for key in params:
        assert g_ours[key][...].dtype == params[key][...].dtype, key
        assert _rel(g_ours[key][...], g_ref[key][...]) <= tol, (key, _rel(g_ours[key][...], g_ref[key][...]))
    # dx is rounded to the input's dtype.
    assert dx_ours.dtype == x.dtype and _rel(dx_ours, dx_ref) <= max(tol, _tol(x.dtype)), _rel(dx_ours, dx_ref)
    if jnp.dtype(compute_dtype) != jnp.float32:  # and nnx's own 16-bit output
        theirs_y = _forward(theirs, x, act)
        assert theirs_y.dtype == got.dtype and _rel(got, theirs_y) <= tol, _rel(got, theirs_y)
    return got


def _round_trip(make_ours, make_theirs, x, act, compute_dtype):
    """State of an nnx layer loads into ours unchanged, and ours into an nnx layer."""
    for ours, theirs, source, target in [(make_ours(seed=1), make_theirs(seed=2), "theirs", "ours"),
                                         (make_ours(seed=3), make_theirs(seed=4), "ours", "theirs")]:
        layers = dict(ours=ours, theirs=theirs)
        nnx.update(layers[target], nnx.state(layers[source]))
        _assert_same_params(ours, theirs)
        want = _run(_reference(theirs, compute_dtype), _round(x, compute_dtype), act)[0]
        assert _rel(_run(ours, x)[0], want) <= _tol(compute_dtype)


def _input(shape, dtype, seed=0):
    """Random inputs made in numpy (no compilation)."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32).astype(dtype))


# The layers' shapes are shared between the tests (so that the parameter initializers
# compile few times): mostly Linear(8, 16) and Conv(8, 8, (3, 3)).

# ---------------------------------------------------------------------------------------
# Linear

LINEAR_CASES = [
    # use_bias, param_dtype, dtype, input dtype, activation
    (True, F32, None, F32, None),
    (False, F32, None, F32, "relu"),
    (True, F32, None, F32, jax.nn.gelu),
    (True, F32, F32, BF16, GELU_EXACT),
    (True, BF16, None, BF16, None),
    (True, F32, BF16, F32, "relu"),
    (False, BF16, BF16, F32, jax.nn.gelu),
]


@pytest.mark.parametrize("use_bias,param_dtype,dtype,x_dtype,activation", LINEAR_CASES)
def test_linear_matches_nnx(use_bias, param_dtype, dtype, x_dtype, activation):
    kwargs = dict(use_bias=use_bias, param_dtype=param_dtype, dtype=dtype)
    if (use_bias, param_dtype, dtype, x_dtype, activation) != LINEAR_CASES[0]:
        kwargs["kernel_init"] = KERNEL_INIT  # else nnx's default
    if use_bias and activation is not None:
        kwargs["bias_init"] = BIAS_INIT  # else nnx's default (zeros)
    make_theirs = lambda seed=0: nnx.Linear(8, 16, **kwargs, rngs=nnx.Rngs(seed))
    make_ours = lambda seed=0: jf.Linear(8, 16, **kwargs, activation=activation, rngs=nnx.Rngs(seed))
    ours, theirs = make_ours(), make_theirs()
    _assert_same_params(ours, theirs)
    act = _act_fn(activation)
    compute = jnp.dtype(dtype or jnp.result_type(x_dtype, param_dtype))
    x = _input((2, 5, 8), x_dtype)  # two leading batch axes
    y = _compare(ours, theirs, x, act, compute)
    assert y.shape == (2, 5, 16)
    _round_trip(make_ours, make_theirs, x, act, compute)


def test_linear_vector_input_and_preferred_element_type():
    kwargs = dict(param_dtype=BF16, preferred_element_type=F32, kernel_init=KERNEL_INIT)
    theirs = nnx.Linear(8, 16, **kwargs, rngs=nnx.Rngs(0))
    ours = jf.Linear(8, 16, **kwargs, rngs=nnx.Rngs(0))
    x = _input((8,), BF16)
    got, want = ours(x), theirs(x)
    assert got.shape == want.shape == (16,) and got.dtype == want.dtype == F32
    assert _rel(got, want) <= 1e-2


def test_linear_signature_mirrors_nnx():
    _check_signature(jf.Linear, nnx.Linear, {"dot_general"},
                     added=("activation", "fp8", "fp8_history", "fp8_grad_format"))  # fmt: skip


@pytest.mark.parametrize("scaling", CURRENT_SCALINGS)
def test_linear_fp8_is_the_fp8_layer(scaling):
    """fp8= runs the layer on jaxgemm.fp8.dense (forward and gradients the same arrays),
    within e4m3's rounding of the unquantized layer; the parameters stay float32."""
    layer = jf.Linear(256, 128, activation="gelu", fp8=scaling, rngs=nnx.Rngs(0))
    assert layer.fp8 == scaling and layer.kernel[...].dtype == jnp.float32
    x = jax.random.normal(jax.random.key(1), (64, 256), jnp.float32)
    loss = lambda layer, x: jnp.sum(layer(x) ** 2)
    direct = lambda w, b, x: jnp.sum(jaxgemm.fp8.dense(x, w, b, "gelu", scaling=scaling) ** 2)
    y = layer(x)
    np.testing.assert_array_equal(y, jaxgemm.fp8.dense(x, layer.kernel[...], layer.bias[...], "gelu", scaling=scaling))
    grads = nnx.grad(loss)(layer, x)
    want_w, want_b = jax.grad(direct, argnums=(0, 1))(layer.kernel[...], layer.bias[...], x)
    np.testing.assert_array_equal(grads["kernel"][...], want_w)
    np.testing.assert_array_equal(grads["bias"][...], want_b)
    unquantized = jf.Linear(256, 128, activation="gelu", rngs=nnx.Rngs(0))
    assert _rel(y, unquantized(x)) <= 0.1  # (test_fp8.QUANTIZATION_BOUND)


def test_linear_fp8_grad_format_is_the_layers():
    """fp8_grad_format="e5m2": the gradients are fp8.dense's with grad_format="e5m2"."""
    layer = jf.Linear(256, 128, activation="gelu", fp8="rowwise", fp8_grad_format="e5m2", rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (64, 256), jnp.float32)
    grads = nnx.grad(lambda layer, x: jnp.sum(layer(x) ** 2))(layer, x)
    direct = lambda w, b, fmt: jnp.sum(jaxgemm.fp8.dense(x, w, b, "gelu", grad_format=fmt) ** 2)  # noqa: E731
    want_w = jax.grad(direct)(layer.kernel[...], layer.bias[...], "e5m2")
    np.testing.assert_array_equal(grads["kernel"][...], want_w)
    assert not np.array_equal(want_w, jax.grad(direct)(layer.kernel[...], layer.bias[...], "e4m3"))


def test_linear_fp8_delayed_trains_its_history():
    """fp8="delayed": an Fp8History variable (3, H) of zeros; the training step of the
    module docstring writes the history's gradient (this step's amax pushed in front) into
    it and hands the optimizer the parameters' gradients only, the same as fp8.dense's."""
    layer = jf.Linear(256, 128, activation="gelu", fp8="delayed", fp8_history=4, rngs=nnx.Rngs(0))
    assert isinstance(layer.fp8_history, jf.Fp8History) and layer.fp8_history[...].shape == (3, 4)
    x = jax.random.normal(jax.random.key(1), (64, 256), jnp.float32)
    loss = lambda layer, x: jnp.sum(layer(x) ** 2)
    optimizer = nnx.Optimizer(layer, optax.sgd(1e-3), wrt=nnx.Param)
    w0, b0 = layer.kernel[...], layer.bias[...]

    @nnx.jit
    def step(layer, optimizer, x):
        value, grads = nnx.value_and_grad(loss, argnums=nnx.DiffState(0, jf.FP8_TRAINABLE))(layer, x)
        optimizer.update(layer, jf.write_fp8_histories(layer, grads))
        return value

    step(layer, optimizer, x)
    direct = lambda w, b, h, x: jnp.sum(jaxgemm.fp8.dense(x, w, b, "gelu", scaling="delayed", history=h) ** 2)
    want_w, want_b, want_h = jax.grad(direct, argnums=(0, 1, 2))(w0, b0, jaxgemm.fp8.amax_history(4), x)
    np.testing.assert_array_equal(layer.fp8_history[...], jnp.stack(want_h))
    assert float(layer.fp8_history[0, 0]) == float(jnp.max(jnp.abs(x))) and float(layer.fp8_history[0, 1]) == 0
    np.testing.assert_allclose(layer.kernel[...], w0 - 1e-3 * want_w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(layer.bias[...], b0 - 1e-3 * want_b, rtol=1e-6, atol=1e-7)


def test_linear_fp8_must_name_a_scaling():
    with pytest.raises(ValueError, match="fp8 must be None or one of"):
        jf.Linear(4, 4, fp8="tensorwise", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="fp8='rowwise' takes none"):
        jf.Linear(4, 4, fp8="rowwise", fp8_history=8, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="length must be a positive int"):
        jf.Linear(4, 4, fp8="delayed", fp8_history=0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="fp8_grad_format must be None or one of"):
        jf.Linear(4, 4, fp8="delayed", fp8_grad_format="e3m4", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="with an fp8 scaling, got 'e5m2' with fp8=None"):
        jf.Linear(4, 4, fp8_grad_format="e5m2", rngs=nnx.Rngs(0))


# ---------------------------------------------------------------------------------------
# Conv

CONV_CASES = [
    # kernel_size, strides, padding, kernel_dilation, groups, use_bias, param_dtype, dtype, activation
    ((3, 3), 1, "SAME", 1, 1, True, F32, None, None),
    ((3, 3), 2, "SAME", 1, 1, True, F32, None, "relu"),
    ((3, 3), 1, "VALID", 1, 1, False, F32, None, jax.nn.gelu),
    ((3, 3), 2, 1, 1, 2, True, F32, None, "silu"),
    ((3, 3), 1, ((1, 0), (2, 1)), 2, 1, True, F32, None, "relu"),
    ((3, 2), (2, 1), "SAME_LOWER", 1, 1, True, F32, None, None),
    ((3, 3), 1, "SAME", 1, 1, True, BF16, None, "relu"),
    ((3, 3), 2, "VALID", (1, 2), 2, False, F32, BF16, jax.nn.gelu),
    ((3, 3), 1, "CIRCULAR", 1, 1, True, F32, None, None),
    ((3, 3), 2, "REFLECT", 2, 1, True, F32, None, jnp.tanh),
]


@pytest.mark.parametrize(
    "kernel_size,strides,padding,dilation,groups,use_bias,param_dtype,dtype,activation", CONV_CASES
)
def test_conv_matches_nnx(kernel_size, strides, padding, dilation, groups, use_bias, param_dtype, dtype, activation):
    kwargs = dict(
        strides=strides,
        padding=padding,
        kernel_dilation=dilation,
        feature_group_count=groups,
        use_bias=use_bias,
        param_dtype=param_dtype,
        dtype=dtype,
    )
    if (kernel_size, strides, padding, dilation, groups, use_bias, param_dtype, dtype, activation) != CONV_CASES[0]:
        kwargs["kernel_init"] = KERNEL_INIT
    if use_bias and activation is not None:
        kwargs["bias_init"] = BIAS_INIT
    make_theirs = lambda seed=0: nnx.Conv(8, 8, kernel_size, **kwargs, rngs=nnx.Rngs(seed))
    make_ours = lambda seed=0: jf.Conv(8, 8, kernel_size, **kwargs, activation=activation, rngs=nnx.Rngs(seed))
    ours, theirs = make_ours(), make_theirs()
    _assert_same_params(ours, theirs)
    assert ours.kernel.shape == kernel_size + (8 // groups, 8)
    act = _act_fn(activation)
    compute = jnp.dtype(dtype or param_dtype)
    x = _input((2, 9, 8, 8), param_dtype)
    _compare(ours, theirs, x, act, compute)
    _round_trip(make_ours, make_theirs, x, act, compute)


@pytest.mark.parametrize("shape", [(9, 8, 8), (2, 3, 9, 8, 8)], ids=["unbatched", "two_batch_axes"])
def test_conv_batch_axes(shape):
    theirs = nnx.Conv(8, 8, (3, 3), strides=2, rngs=nnx.Rngs(0))
    ours = jf.Conv(8, 8, (3, 3), strides=2, rngs=nnx.Rngs(0))
    x = _input(shape, F32)
    got, want = _run(ours, x)[0], _run(theirs, x)[0]
    assert got.shape == want.shape == shape[:-3] + (5, 4, 8)
    assert _rel(got, want) <= 1e-5


def test_conv_mask_and_preferred_element_type():
    mask = jnp.asarray(np.tril(np.ones((3, 3, 8, 8), np.float32)))
    kwargs = dict(mask=mask, param_dtype=BF16, preferred_element_type=F32, kernel_init=KERNEL_INIT)
    theirs = nnx.Conv(8, 8, (3, 3), **kwargs, rngs=nnx.Rngs(0))
    ours = jf.Conv(8, 8, (3, 3), **kwargs, rngs=nnx.Rngs(0))
    x = _input((2, 6, 6, 8), BF16)
    got, want = ours(x), theirs(x)
    assert got.dtype == want.dtype == F32
    assert _rel(got, want) <= 1e-2


def test_conv_signature_mirrors_nnx():
    _check_signature(jf.Conv, nnx.Conv, {"conv_general_dilated"})


def _check_signature(ours, theirs, dropped, added=("activation",)):
    """Every nnx argument but `dropped` is ours too, same kind and default; ours adds `added`
    (`activation`, and Linear's `fp8`), keyword-only, default None."""
    mine = inspect.signature(ours.__init__).parameters
    flax_params = inspect.signature(theirs.__init__).parameters
    assert set(mine) == (set(flax_params) - dropped) | set(added)
    for name, p in flax_params.items():
        if name in dropped:
            continue
        assert mine[name].kind == p.kind, name
        assert mine[name].default is p.default or mine[name].default == p.default, name
    assert list(mine)[: list(mine).index("use_bias")] == list(flax_params)[: list(flax_params).index("use_bias")]
    for name in added:
        assert mine[name].default is None and mine[name].kind == inspect.Parameter.KEYWORD_ONLY, name


# ---------------------------------------------------------------------------------------
# Activations and unsupported options


@pytest.mark.parametrize(
    "activation,name",
    [(None, None), ("silu", "silu"), (jax.nn.relu, "relu"), (nnx.relu, "relu"), (jax.nn.gelu, "gelu"),
     (functools.partial(jax.nn.gelu, approximate=True), "gelu"), (GELU_EXACT, "gelu_exact"),
     (jax.nn.silu, "silu"), (jax.nn.swish, "silu"), (jax.nn.sigmoid, "sigmoid"), (jnp.tanh, "tanh")],
)  # fmt: skip
def test_activation_is_stored_as_its_fused_name(activation, name):
    assert jf.Linear(8, 16, activation=activation, rngs=nnx.Rngs(0)).activation == name
    assert jf.Conv(8, 8, (3, 3), activation=activation, rngs=nnx.Rngs(0)).activation == name


def test_activation_without_fused_form():
    for fn in (jax.nn.elu, jax.nn.softplus, lambda z: z * 2):
        with pytest.raises(TypeError, match="no fused form"):
            jf.Linear(8, 16, activation=fn, rngs=nnx.Rngs(0))
        with pytest.raises(TypeError, match="no fused form"):
            jf.Conv(8, 8, (3, 3), activation=fn, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="unknown activation"):
        jf.Conv(8, 8, (3, 3), activation="swishy", rngs=nnx.Rngs(0))


@pytest.mark.parametrize(
    "kwargs,argument",
    [
        (dict(kernel_size=3), "kernel_size"),
        (dict(kernel_size=(3, 3, 3)), "kernel_size"),
        (dict(input_dilation=2), "input_dilation"),
        (dict(strides=(1, 1, 1)), "strides"),
        (dict(kernel_dilation=(1, 2, 1)), "kernel_dilation"),
        (dict(padding="CAUSAL"), "padding"),
        (dict(padding=((1, 1), (1, 1), (1, 1))), "padding"),
        (dict(feature_group_count=3), "feature_group_count"),
    ],
)
def test_conv_unsupported_options(kwargs, argument):
    kwargs = dict(dict(kernel_size=(3, 3)), **kwargs)
    with pytest.raises(ValueError, match=argument):
        jf.Conv(8, 8, rngs=nnx.Rngs(0), **kwargs)


# ---------------------------------------------------------------------------------------
# NNX transforms


def _stack(cls, seed, **kwargs):
    """3 Linear(8, 8) layers stacked on a leading axis (nnx.split_rngs + nnx.vmap)."""

    @nnx.split_rngs(splits=3)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs):
        return cls(8, 8, **kwargs, kernel_init=KERNEL_INIT, bias_init=BIAS_INIT, rngs=rngs)

    return create(nnx.Rngs(seed))


def _scan_loss(stack, x, act):
    """The stack applied with nnx.scan (act after each layer: the reference's fused part)."""

    @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
    def step(layer, h):
        return act(layer(h))

    return jnp.sum(jnp.cos(step(stack, x)))


_scan_value_and_grad = nnx.jit(nnx.value_and_grad(_scan_loss), static_argnums=2)


def test_vmap_created_stack_applied_with_scan():
    ours = _stack(jf.Linear, 0, activation="relu")
    theirs = _stack(nnx.Linear, 0)
    assert ours.kernel.shape == (3, 8, 8) and ours.bias.shape == (3, 8)
    _assert_same_params(ours, theirs)
    x = _input((4, 8), F32)
    want, g_want = _scan_value_and_grad(theirs, x, jax.nn.relu)
    got, g_got = _scan_value_and_grad(ours, x, _identity)
    assert _rel(got, want) <= 1e-5
    _assert_close_trees(g_got, g_want, 1e-5)
    # The stack's state moves to an nnx stack.
    other = _stack(nnx.Linear, 5)
    nnx.update(other, nnx.state(ours))
    assert _rel(_scan_value_and_grad(other, x, jax.nn.relu)[0], got) <= 1e-5


def test_vmap_over_inputs():
    ours = jf.Conv(8, 8, (3, 3), activation="relu", rngs=nnx.Rngs(0))
    theirs = nnx.Conv(8, 8, (3, 3), rngs=nnx.Rngs(0))
    x = _input((3, 2, 6, 6, 8), F32)
    apply = nnx.jit(nnx.vmap(lambda m, x, act: act(m(x)), in_axes=(None, 0, None)), static_argnums=2)
    got, want = apply(ours, x, _identity), apply(theirs, x, jax.nn.relu)
    assert got.shape == want.shape == (3, 2, 6, 6, 8)
    assert _rel(got, want) <= 1e-5


def _remat_loss(model, x, act):
    h = nnx.remat(lambda m, h: act(m(h)))(model, x)
    return jnp.sum(h**2)


def test_remat():
    ours = jf.Linear(8, 16, activation="gelu", rngs=nnx.Rngs(0))
    theirs = nnx.Linear(8, 16, rngs=nnx.Rngs(0))
    x = _input((4, 8), F32)
    grad = nnx.jit(nnx.grad(_remat_loss), static_argnums=2)
    _assert_close_trees(grad(ours, x, _identity), grad(theirs, x, jax.nn.gelu), 1e-5)


class _Net(nnx.Module):
    """A small CNN whose layers come from either namespace (ours fuse the relus)."""

    def __init__(self, ns, rngs):
        act = dict(activation="relu") if ns is jf else {}
        self.act = _identity if ns is jf else jax.nn.relu
        self.conv1 = ns.Conv(8, 8, (3, 3), **act, rngs=rngs)
        self.conv2 = ns.Conv(8, 8, (3, 3), strides=2, **act, rngs=rngs)
        self.fc = ns.Linear(8, 16, rngs=rngs)

    def __call__(self, x):
        h = self.act(self.conv2(self.act(self.conv1(x))))
        return self.fc(h.mean(axis=(1, 2)))


def _train_loss(model, x, labels):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), labels).mean()


@nnx.jit
def _train_step(model, optimizer, x, labels):
    value, grads = nnx.value_and_grad(_train_loss)(model, x, labels)
    optimizer.update(model, grads)
    return value


def test_optax_training_steps_match():
    """A drop-in: the same model with nnx's layers and ours trains the same under nnx.jit."""
    models = {ns.__name__: _Net(ns, nnx.Rngs(0)) for ns in (nnx, jf)}
    _assert_same_params(models["jaxgemm.flax"], models["flax.nnx"])
    x, labels = _input((4, 6, 6, 8), F32), jnp.arange(4) % 16
    losses = {}
    for name, model in models.items():
        optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
        losses[name] = [float(_train_step(model, optimizer, x, labels)) for _ in range(3)]
    np.testing.assert_allclose(losses["jaxgemm.flax"], losses["flax.nnx"], rtol=1e-4)
    assert losses["jaxgemm.flax"][-1] < losses["jaxgemm.flax"][0]
    _assert_close_trees(nnx.state(models["jaxgemm.flax"], nnx.Param), nnx.state(models["flax.nnx"], nnx.Param), 1e-4)


def test_data_parallel_under_an_explicit_mesh():
    """Layers made under an Explicit mesh, batch-sharded inputs: out_sharding passes
    through, and the gradients (all-reduces of the weights' partial sums) equal the
    unsharded ones."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    if jax.device_count() < 2:
        pytest.skip("needs 2 devices")
    mesh = jax.make_mesh((2,), ("data",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:2])

    def layers():
        return (jf.Linear(8, 16, activation="relu", bias_init=BIAS_INIT, rngs=nnx.Rngs(0)),
                jf.Conv(8, 8, (3, 3), strides=2, activation="gelu", rngs=nnx.Rngs(0)))  # fmt: skip

    def loss(linear, conv, x, xi):
        return jnp.sum(linear(x) ** 2) + jnp.sum(jnp.cos(conv(xi)))

    x, xi = _input((4, 8), F32), _input((4, 6, 6, 8), F32)
    grad = nnx.jit(nnx.grad(loss, argnums=(0, 1)))
    want = grad(*layers(), x, xi)
    with jax.set_mesh(mesh):
        linear, conv = layers()
        xs = jax.device_put(x, NamedSharding(mesh, P("data")))
        xis = jax.device_put(xi, NamedSharding(mesh, P("data")))
        y = nnx.jit(lambda m, x: m(x, out_sharding=P("data", None)))(linear, xs)
        assert y.sharding.spec == P("data", None)
        assert _rel(y, jax.nn.relu(x @ np.asarray(linear.kernel[...]) + np.asarray(linear.bias[...]))) <= 1e-5
        got = grad(linear, conv, xs, xis)
    for g, w in zip(got, want):
        _assert_close_trees(g, w, 1e-5)


def test_tensor_parallel_with_partitioning_annotations():
    """Megatron-style MLP annotated with nnx.with_partitioning (column- then row-parallel),
    created sharded under an Auto mesh: parameters land sharded, and the gradients and the
    compiled step's all-reduces equal those of the same model built from nnx.Linear."""
    import re

    from jax.sharding import AxisType
    from jax.sharding import PartitionSpec as P

    if jax.device_count() < 2:
        pytest.skip("needs 2 devices")
    mesh = jax.make_mesh((2,), ("model",), axis_types=(AxisType.Auto,), devices=jax.devices()[:2])
    init = nnx.initializers.lecun_normal()

    class Mlp(nnx.Module):
        def __init__(self, layer, rngs):
            self.up = layer(8, 16, kernel_init=nnx.with_partitioning(init, (None, "model")),
                            bias_init=nnx.with_partitioning(BIAS_INIT, ("model",)), rngs=rngs)  # fmt: skip
            self.down = layer(16, 8, kernel_init=nnx.with_partitioning(init, ("model", None)), rngs=rngs)

        def __call__(self, x):
            return self.down(jax.nn.gelu(self.up(x)))

    def create(layer):
        @nnx.jit
        def make():
            model = Mlp(layer, nnx.Rngs(0))
            state = nnx.state(model)
            nnx.update(model, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
            return model

        return make()

    def loss(model, x):
        return jnp.sum(model(x) ** 2)

    x = _input((4, 8), F32)
    results = {}
    with jax.set_mesh(mesh):
        for name, layer in (("jaxgemm.flax", jf.Linear), ("flax.nnx", nnx.Linear)):
            model = create(layer)
            graphdef, state = nnx.split(model)
            step = jax.jit(jax.grad(lambda state, x: loss(nnx.merge(graphdef, state), x)))
            hlo = step.lower(state, x).compile().as_text()
            results[name] = (model, step(state, x), len(re.findall(r"all-reduce(?:-start)?\(", hlo)))
    ours, theirs = results["jaxgemm.flax"], results["flax.nnx"]
    assert ours[0].up.kernel[...].sharding.spec == P(None, "model")
    assert ours[0].down.kernel[...].sharding.spec in (P("model"), P("model", None))
    _assert_close_trees(ours[1], theirs[1], 1e-5)
    assert ours[2] == theirs[2] > 0  # the row-parallel layer's sums, forward and backward
