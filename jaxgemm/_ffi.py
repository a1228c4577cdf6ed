"""Loads the compiled extension and registers its XLA FFI handlers, once, at import."""

from __future__ import annotations

import jax

from jaxgemm import _jaxgemm

WITH_CUDA: bool = bool(_jaxgemm.with_cuda)


def _register() -> None:
    for name, capsule in _jaxgemm.cpu_registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    for name, capsule in _jaxgemm.cuda_registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")


_register()
