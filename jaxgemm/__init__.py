"""jaxgemm: fused, differentiable CUDA GEMM kernels for JAX, through the XLA FFI."""

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
