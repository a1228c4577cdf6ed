"""What a JAX user passes as they would to jnp / Flax: jax.nn activations, traced scalars,
dtype promotion with the epilogue operands."""

import functools
import glob
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemm
from reference import random, rel_error, to64


@pytest.mark.parametrize(
    "fn,name",
    [(jax.nn.relu, "relu"), (jax.nn.gelu, "gelu"), (functools.partial(jax.nn.gelu, approximate=False), "gelu_exact"),
     (jax.nn.silu, "silu"), (jax.nn.sigmoid, "sigmoid"), (jnp.tanh, "tanh")],
)  # fmt: skip
def test_jax_nn_activations_are_their_fused_forms(fn, name):
    rng = np.random.default_rng(0)
    x, w, b = random(rng, (6, 5), jnp.float32), random(rng, (5, 4), jnp.float32), random(rng, (4,), jnp.float32)
    assert rel_error(jaxgemm.dense(x, w, b, fn), to64(jaxgemm.dense(x, w, b, name))) == 0
    assert rel_error(jaxgemm.dense(x, w, b, fn), to64(fn(x @ w + b))) <= 1e-5
    xi, wi = random(rng, (1, 5, 5, 2), jnp.float32), random(rng, (3, 3, 2, 3), jnp.float32)
    assert rel_error(jaxgemm.conv2d(xi, wi, activation=fn), to64(jaxgemm.conv2d(xi, wi, activation=name))) == 0


def test_activation_without_fused_form_names_itself():
    with pytest.raises(TypeError, match="softplus has no fused form"):
        jaxgemm.matmul(jnp.ones((2, 3)), jnp.ones((3, 4)), activation=jax.nn.softplus)


def test_traced_scalars():
    rng = np.random.default_rng(1)
    a, b, c = random(rng, (4, 6), jnp.float32), random(rng, (6, 5), jnp.float32), random(rng, (4, 5), jnp.float32)
    got = jax.jit(lambda s: jaxgemm.matmul(a, b, alpha=s))(0.5)
    assert rel_error(got, to64(0.5 * (a @ b))) <= 1e-5
    got = jax.jit(lambda s: jaxgemm.matmul(a, b, beta=s, c=c, activation="relu"))(1.5)
    assert rel_error(got, to64(jax.nn.relu(a @ b + 1.5 * c))) <= 1e-5
    with pytest.raises(TypeError, match="alpha is a traced value"):
        jax.jit(lambda s: jaxgemm.matmul(a, b, alpha=s, activation="relu"))(0.5)


def test_result_dtype_promotes_like_jnp():
    x, w = jnp.ones((4, 8), jnp.bfloat16), jnp.ones((8, 6), jnp.bfloat16)
    for bias in (jnp.ones((6,), jnp.float32), jnp.ones((6,), jnp.bfloat16)):
        assert jaxgemm.dense(x, w, bias).dtype == (x @ w + bias).dtype
        assert jaxgemm.conv2d(x.reshape(1, 2, 2, 8), w.reshape(1, 1, 8, 6), bias=bias).dtype == (x @ w + bias).dtype


def test_submodules_load_on_first_use():
    """`jaxgemm.flax.Linear` after a bare `import jaxgemm`, as the README writes it, without
    `import jaxgemm` importing Flax."""
    code = ("import sys, jaxgemm; assert 'flax' not in sys.modules; "
            "assert jaxgemm.flax.Linear.__module__ == 'jaxgemm.flax'; print('ok')")  # fmt: skip
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, cwd=here)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    with pytest.raises(AttributeError, match="no attribute 'flaxx'"):
        jaxgemm.flaxx


def test_import_from_the_source_folder_says_what_to_do():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if glob.glob(os.path.join(root, "jaxgemm", "_jaxgemm*")):
        pytest.skip("the source folder holds a compiled module (an in-place build)")
    done = subprocess.run([sys.executable, "-c", "import jaxgemm"], capture_output=True, text=True, cwd=root)
    assert done.returncode != 0
    assert "imported from its source folder" in done.stderr and "Run from another directory" in done.stderr


def test_dtype_sets_come_from_the_element_table():
    """kernels' dtype sets are ffi_src/common/element_type.h's rows (fp8 is scaled_matmul's)."""
    from jaxgemm import kernels

    names = [row["name"] for row in jaxgemm._jaxgemm.element_types()]
    assert [d.name for d in kernels.SUPPORTED_DTYPES] == [n for n in names if not n.startswith("float8")]
    assert kernels.HALF_DTYPES == {jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)}
    with pytest.raises(TypeError, match="float32, float16, bfloat16"):
        jaxgemm.matmul(jnp.ones((2, 2), jnp.int32), jnp.ones((2, 2), jnp.int32))


def test_the_schedule_table_names_each_kernels_tiles():
    """Every kernel family takes its tiles from the one table: 16-bit GEMMs (all rows but the
    block-scaled one), tf32 and fp8 a subset, the block-scaled fp8 GEMM its own 128 x 192
    row, the convolutions 128-row tiles (the weight gradient's pingpong ones)."""
    from jaxgemm import kernels

    rows = kernels.SM90_SCHEDULES
    assert [s.tile for s in rows if s.block_scaled] == [(128, 192)]
    assert all(not (s.half or s.tf32 or s.fp8) for s in rows if s.block_scaled)
    assert {s.tile for s in rows if s.tf32} < {s.tile for s in rows if s.half}
    assert {s.tile for s in rows if s.fp8} < {s.tile for s in rows if s.half}
    assert {s.tile for s in rows if s.conv_fprop} == {(128, 256), (128, 128), (128, 64)}
    assert {s.tile for s in rows if s.conv_wgrad} == {(128, 128), (128, 64)}
    assert all(s.pingpong for s in rows if s.conv_wgrad)
    assert kernels.sm90_tiles(jnp.bfloat16) == tuple(s.tile for s in rows if s.half)
    assert (128, 192) not in kernels.sm90_tiles(jnp.float8_e4m3fn) + kernels.sm90_tiles(jnp.float32)
