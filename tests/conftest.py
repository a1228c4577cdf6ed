import os

# Handlers fill outputs with NaN before computing (ffi_src/ffi/poison.h), so an element a
# kernel fails to write makes the comparison fail. Must be set before the first call.
os.environ.setdefault("JAXGEMM_POISON_OUTPUTS", "1")
# On a CPU the ops lower to XLA's own dot and convolution unless JAXGEMM_CPU=ffi; the tests
# run the FFI CPU handlers, so that every CPU test goes through the whole JAX -> FFI path
# (tests/test_xla_cpu.py checks the XLA lowering).
os.environ.setdefault("JAXGEMM_CPU", "ffi")

# Eight host CPU devices, so that tests/test_sharding.py can build meshes on a machine
# without accelerators. Must be set before jax is imported; a device count already in
# XLA_FLAGS (or JAX_NUM_CPU_DEVICES) is kept, as are the other flags.
_xla_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _xla_flags and "JAX_NUM_CPU_DEVICES" not in os.environ:
    os.environ["XLA_FLAGS"] = (_xla_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import pytest  # noqa: E402


def on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def _shard(items, config):
    """JAXGEMM_TEST_SHARD=i/n keeps every n-th test from the i-th (1-based), so that a suite
    longer than one call on a lent GPU runs in n calls of about equal length (the
    parametrizations of each test are dealt out across the shards)."""
    shard = os.environ.get("JAXGEMM_TEST_SHARD")
    if not shard:
        return
    i, n = (int(x) for x in shard.split("/"))
    if not 1 <= i <= n:
        raise pytest.UsageError(f"JAXGEMM_TEST_SHARD={shard}: want i/n with 1 <= i <= n")
    config.hook.pytest_deselected(items=[item for k, item in enumerate(items) if k % n != i - 1])
    items[:] = items[i - 1::n]


def pytest_collection_modifyitems(config, items):
    _shard(items, config)
    if on_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: runs only where JAX's default backend is a GPU")


def pytest_make_parametrize_id(config, val, argname):
    """Tiles read as "256x128" in test ids (so `-k 256x128` picks one schedule)."""
    if argname == "tile" and isinstance(val, tuple) and len(val) == 2:
        return f"{val[0]}x{val[1]}"
    return None
