"""jaxgemm: fused, differentiable CUDA GEMM kernels for JAX, through the XLA FFI."""

import importlib as _importlib
import os as _os


def _missing_extension(error: ImportError) -> ImportError:
    """An ImportError that says why the compiled module did not load and what to do."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    if _os.path.exists(_os.path.join(here, _os.pardir, "pyproject.toml")):
        return ImportError(
            f"jaxgemm was imported from its source folder ({here}), which holds no compiled module: "
            "Python looks in the current directory first. Run from another directory, or with `python -P`, "
            "after `pip install .` (`JAXGEMM_CUDA=OFF pip install .`: a CPU-only build in a minute or two). "
            f"The import error: {error}")  # fmt: skip
    return ImportError(f"jaxgemm's compiled module failed to load ({error}); reinstall it with `pip install .` "
                       "from the source checkout")  # fmt: skip


# jax before the extension: with CUDA, loading the extension first made `import jax` crash.
import jax as _jax  # noqa: F401

try:
    from jaxgemm import _jaxgemm  # noqa: F401  (the nanobind module with the FFI handlers)
except ImportError as _error:
    raise _missing_extension(_error) from None

from jaxgemm import fp8
from jaxgemm._ffi import WITH_CUDA
from jaxgemm.activations import NAMES as ACTIVATIONS
from jaxgemm.collective import all_gather_matmul, matmul_reduce_scatter
from jaxgemm.conv import ConvConfig, conv2d
from jaxgemm.gemm import GemmConfig, gemm_p
from jaxgemm.matmul import matmul
from jaxgemm.nn import dense
from jaxgemm.ragged import ragged_dot
from jaxgemm.ragged_glu import ragged_glu
from jaxgemm.scaled import scaled_matmul

__all__ = [
    "ACTIVATIONS",
    "ConvConfig",
    "GemmConfig",
    "WITH_CUDA",
    "all_gather_matmul",
    "conv2d",
    "dense",
    "fp8",
    "gemm_p",
    "matmul",
    "matmul_reduce_scatter",
    "ragged_dot",
    "ragged_glu",
    "scaled_matmul",
]
__version__ = "0.1.0"

# Submodules loaded on first use, so that `import jaxgemm` does not import Flax.
_LAZY_SUBMODULES = ("flax",)


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        return _importlib.import_module(f"jaxgemm.{name}")
    raise AttributeError(f"module 'jaxgemm' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY_SUBMODULES])
