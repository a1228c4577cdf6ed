// One operand tile of the sm80 (mma.sync) mainloop in shared memory: 16-byte cp.async
// chunks from global memory, an XOR swizzle on the chunk index so that both the copies and
// the ldmatrix reads are free of bank conflicts, and the ldmatrix address of each lane.
//
// kKContiguous (row-major A, transposed B): stored [kExtent][kBK], rows of K; ldmatrix
// without .trans yields mma fragments. Otherwise stored [kBK][kExtent] and read with .trans.
#pragma once
#include <cstdint>

#include "common/ptx.cuh"

namespace jaxgemm {

template <class T, int kExtent, int kBK, int kThreads, bool kKContiguous>
struct Sm80Tile {
  static_assert(sizeof(T) == 2, "16-bit elements");
  static constexpr int kRowElems = kKContiguous ? kBK : kExtent;
  static constexpr int kRows = kKContiguous ? kExtent : kBK;
  static constexpr int kChunksPerRow = kRowElems / 8;  // 16-byte chunks
  static constexpr int kChunksPerThread = kRows * kChunksPerRow / kThreads;
  static constexpr int kElems = kRows * kRowElems;
  static_assert(kChunksPerRow == 4 || kChunksPerRow % 8 == 0, "swizzle covers 4- or 8k-chunk rows");
  static_assert(kRows * kChunksPerRow % kThreads == 0, "whole chunks per thread");

  // 8 consecutive rows read one chunk column: XOR-ing the chunk index with a function of
  // the row spreads them over the 8 distinct 16-byte bank groups.
  __device__ __forceinline__ static int Offset(int row, int chunk) {
    const int swizzle = kChunksPerRow == 4 ? (row >> 1) & 3 : row & 7;
    return row * kRowElems + ((chunk ^ swizzle) << 3);
  }
  // Element (i along M/N, k) of the tile; k and i multiples of 8 along the stored row.
  __device__ __forceinline__ static int OffsetOf(int i, int k) {
    return kKContiguous ? Offset(i, k >> 3) : Offset(k, i >> 3);
  }

  // Global -> shared copier for one thread.
  struct Loader {
    const T* ptr[kChunksPerThread];
    bool row_ok[kChunksPerThread];  // along M/N (K-contiguous) or the chunk's M/N range
    int k_left;                     // K minus the next tile's first k (K-contiguous: of the chunk)
    int k_of[kChunksPerThread];     // the chunk's k within a tile (extent-contiguous: its row)
    int64_t k_step;

    __device__ __forceinline__ Loader(const T* base, int64_t ld, int64_t extent, int64_t k_size) {
      k_step = kKContiguous ? kBK : kBK * ld;
#pragma unroll
      for (int v = 0; v < kChunksPerThread; ++v) {
        const int linear = v * kThreads + static_cast<int>(threadIdx.x);
        const int row = linear / kChunksPerRow, chunk = linear % kChunksPerRow;
        if (kKContiguous) {  // row = i, chunk = k / 8
          ptr[v] = base + row * ld + chunk * 8;
          row_ok[v] = row < extent;
          k_of[v] = chunk * 8;
        } else {  // row = k, chunk = i / 8
          ptr[v] = base + row * ld + chunk * 8;
          row_ok[v] = chunk * 8 < extent;
          k_of[v] = row;
        }
      }
      k_left = static_cast<int>(k_size);
    }

    // Copies the next k-tile into `smem` (zeros past the edges: chunks are wholly in or out
    // because leading dimensions are multiples of 8 on this path).
    __device__ __forceinline__ void IssueNext(T* smem) {
#pragma unroll
      for (int v = 0; v < kChunksPerThread; ++v) {
        const int linear = v * kThreads + static_cast<int>(threadIdx.x);
        const int row = linear / kChunksPerRow, chunk = linear % kChunksPerRow;
        const bool ok = row_ok[v] && k_of[v] < k_left;
        CpAsync16(smem + Offset(row, chunk), ok ? ptr[v] : ptr[0], ok);
        ptr[v] += k_step;
      }
      k_left -= kBK;
    }
  };
};

}  // namespace jaxgemm
