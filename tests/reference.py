"""float64 references and the error measure the tests share."""

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
