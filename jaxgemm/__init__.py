"""jaxgemm: fused, differentiable CUDA GEMM kernels for JAX, through the XLA FFI."""

from jaxgemm._ffi import WITH_CUDA
from jaxgemm.gemm import GemmConfig, gemm_p, matmul

__all__ = ["GemmConfig", "WITH_CUDA", "gemm_p", "matmul"]
__version__ = "0.1.0"
