"""Activation names, their FFI ids (declared in ffi_src/common/activation.h, read from the
extension) and JAX definitions.

The JAX definitions are the reference the tests compare against and the epilogue applied
after a split-K reduction; the kernels use the shared C++ math.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxgemm import _jaxgemm

_IDS = {None: 0, **_jaxgemm.activation_ids()}

_FUNCTIONS = {
    None: lambda z: z,
    "relu": jax.nn.relu,
    "gelu": lambda z: jax.nn.gelu(z, approximate=True),
    "gelu_exact": lambda z: jax.nn.gelu(z, approximate=False),
    "silu": jax.nn.silu,
    "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh,
}

NAMES = tuple(name for name in _IDS if name is not None)
if set(_IDS) != set(_FUNCTIONS):  # an activation of the kernels without a JAX definition, or the reverse
    raise ImportError(f"jaxgemm: the extension's activations {sorted(NAMES)} differ from activations.py's")


# jax.nn / jnp functions with a fused form, by identity (as Flax users pass them).
_CALLABLES = {jax.nn.relu: "relu", jax.nn.gelu: "gelu", jax.nn.silu: "silu", jax.nn.swish: "silu",
              jax.nn.sigmoid: "sigmoid", jnp.tanh: "tanh", getattr(jax.nn, "tanh", jnp.tanh): "tanh"}


def canonical(activation) -> str | None:
    """The fused activation's name for `activation`: a name, None, or a function from
    jax.nn with a fused form (jax.nn.gelu's default is the tanh form, "gelu";
    functools.partial(jax.nn.gelu, approximate=False) is "gelu_exact")."""
    if activation is None or isinstance(activation, str):
        activation_id(activation)
        return activation
    partial_of = getattr(activation, "func", None)
    if partial_of is jax.nn.gelu and not getattr(activation, "args", ()):
        approximate = activation.keywords.get("approximate", True)
        if set(activation.keywords) <= {"approximate"}:
            return "gelu" if approximate else "gelu_exact"
    try:
        name = _CALLABLES.get(activation)
    except TypeError:  # unhashable
        name = None
    if name is None:
        label = getattr(activation, "__name__", None) or repr(activation)
        raise TypeError(f"activation {label} has no fused form; use None, one of {', '.join(NAMES)}, or the "
                        "jax.nn function of one of them (apply other functions to the result)")
    return name


def activation_id(name: str | None) -> int:
    """The FFI id of `name`; ValueError naming the choices for an unknown one."""
    if name not in _IDS:
        raise ValueError(f"unknown activation {name!r}; use None or one of {', '.join(NAMES)}")
    return _IDS[name]


def apply(name: str | None, z):
    """`name`(z) in JAX (float32 math for half inputs, like the kernels)."""
    activation_id(name)
    return _FUNCTIONS[name](z)


def derivative_from_output(name: str | None) -> bool:
    """Whether act'(z) is exactly a function of act(z) as stored: relu (y > 0 exactly where
    z > 0), so a backward pass may keep y instead of z. sigmoid's y (1 - y) and tanh's
    1 - y^2 are too, in exact arithmetic, but from a rounded y they lose the small values."""
    return name == "relu"


def _slope(f):
    """x -> f'(x) elementwise, for an elementwise f."""
    return lambda x: jax.jvp(f, (x,), (jnp.ones_like(x),))[1]


def derivative(name: str | None, at):
    """act'(at) in float32. For relu `at` may be z or y = relu(z): both are positive exactly
    where z is (derivative_from_output)."""
    at = jnp.asarray(at, jnp.float32)
    if name is None:
        return jnp.ones_like(at)
    if name == "relu":
        return (at > 0).astype(jnp.float32)
    return _slope(_FUNCTIONS[name])(at)


def second_derivative(name: str | None, at):
    """act''(at) in float32 (0 for the identity and relu)."""
    at = jnp.asarray(at, jnp.float32)
    if name in (None, "relu"):
        return jnp.zeros_like(at)
    return _slope(_slope(_FUNCTIONS[name]))(at)
