// Marks functions shared by host code (the CPU reference) and CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define JG_HOST_DEVICE __host__ __device__
#define JG_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define JG_HOST_DEVICE
#define JG_HOST_DEVICE_INLINE inline
#endif
