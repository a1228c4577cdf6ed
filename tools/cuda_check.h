// For the standalone CUDA tools (tools/*.cu, not the library, which returns errors to XLA):
// CHECK(call) prints the failing call and its CUDA error, then exits.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                           \
  do {                                                     \
    cudaError_t e = (x);                                   \
    if (e != cudaSuccess) {                                \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));  \
      std::exit(1);                                        \
    }                                                      \
  } while (0)
