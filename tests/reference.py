"""float64 references, the error measure and a jaxpr walk the tests share."""

import jax.numpy as jnp
import numpy as np

# Relative Frobenius error allowed per input dtype (fp32 accumulation in every case).
TOLERANCE = {
    jnp.dtype(jnp.float32): 1e-5,
    jnp.dtype(jnp.float16): 2e-3,
    jnp.dtype(jnp.bfloat16): 1e-2,
}
TF32_TOLERANCE = 5e-4


def random(rng, shape, dtype):
    """Fresh standard-normal data (never zeros), rounded to `dtype`."""
    return jnp.asarray(rng.standard_normal(shape), dtype=dtype)


def to64(x):
    return np.asarray(jnp.asarray(x, jnp.float32), dtype=np.float64)


def rel_error(out, ref):
    out = to64(out)
    ref = np.asarray(ref, np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert np.all(np.isfinite(out)), "non-finite (unwritten or NaN) elements in the output"
    denom = np.linalg.norm(ref)
    return np.linalg.norm(out - ref) / (denom if denom > 0 else 1.0)


def op(x, transpose):
    return np.swapaxes(x, -1, -2) if transpose else x


def matmul_operands(rng, m, n, k, dtype, ta, tb, batch_a=(), batch_b=()):
    """Random a and b of op(a) @ op(b), stored transposed where ta / tb say."""
    a = random(rng, batch_a + ((k, m) if ta else (m, k)), dtype)
    b = random(rng, batch_b + ((n, k) if tb else (k, n)), dtype)
    return a, b


def matmul_reference(a, b, ta=False, tb=False):
    """op(a) @ op(b) in float64."""
    return np.matmul(op(to64(a), ta), op(to64(b), tb))


def _erf(x):
    from math import erf

    return np.vectorize(erf, otypes=[np.float64])(x)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# float64 activations, written independently of jax.nn.
ACTIVATIONS = {
    None: lambda z: z,
    "relu": lambda z: np.maximum(z, 0.0),
    "gelu": lambda z: 0.5 * z * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (z + 0.044715 * z**3))),
    "gelu_exact": lambda z: 0.5 * z * (1.0 + _erf(z / np.sqrt(2.0))),
    "silu": lambda z: z * _sigmoid(z),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
}


def jaxpr_equations(jaxpr):
    """Every equation of a jaxpr, those of nested jaxprs (jit, custom VJP, cond) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from jaxpr_equations(inner)
