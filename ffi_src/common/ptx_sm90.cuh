// Hopper (sm_90 / sm_90a) PTX wrappers, one instruction each: mbarriers, TMA tile and im2col loads,
// wgmma synchronization, setmaxnreg, and the wgmma shared-memory matrix descriptor.
// Only meaningful in device code compiled for sm_90a; callers guard with JG_SM90_ENABLED.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "common/ptx.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define JG_SM90_ENABLED 1
#endif

namespace jaxgemm {

#if defined(JG_SM90_ENABLED)

__device__ __forceinline__ void MbarrierInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SharedAddress(bar)), "r"(count));
}

// Makes initialized mbarriers visible to the async proxy (TMA) and the other threads.
__device__ __forceinline__ void FenceMbarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void MbarrierArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SharedAddress(bar)) : "memory");
}

// Arrives and tells the barrier to also wait for `bytes` of asynchronous (TMA) writes.
__device__ __forceinline__ void MbarrierArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SharedAddress(bar)), "r"(bytes)
               : "memory");
}

// Spins until the barrier's phase with the given parity has completed. A fresh barrier
// counts its (virtual) previous phase, parity 1, as completed.
__device__ __forceinline__ void MbarrierWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(SharedAddress(bar)),
      "r"(parity)
      : "memory");
}

// MbarrierWait for long waits (a whole mainloop): try_wait with a suspend-time hint, which
// compiles to a sleep that the barrier's completion ends (NANOSLEEP.SYNCS), so the waiting
// warps leave the issue slots to the working warps on the same schedulers. The former
// test_wait + __nanosleep(128) loop hardly slept: in the pingpong schedule its polls were
// 38% of the kernel's executed instructions, with the hint 15% (a 0.7-1.5% gain;
// ffi_src/gemm/NOTES.md, "The pingpong schedule").
__device__ __forceinline__ void MbarrierWaitLong(uint64_t* bar, uint32_t parity) {
  constexpr uint32_t kSuspendNs = 1000000;  // an upper bound; the wait ends with the phase
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(SharedAddress(bar)),
      "r"(parity), "r"(kSuspendNs)
      : "memory");
}

// This block's rank in its thread-block cluster.
__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// Arrives on the mbarrier at the same shared-memory offset in cluster block `rank`. Default
// (CTA-scope release) semantics: a .release.cluster arrive compiles to a GPU-wide memory
// fence before every arrival, which halved the clustered kernel's speed.
__device__ __forceinline__ void MbarrierArriveCluster(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(SharedAddress(bar)),
      "r"(rank)
      : "memory");
}

// As MbarrierArriveCluster, with release semantics at cluster scope: this thread's earlier
// accesses (a read of a value the other block will overwrite) happen before the arrival.
// For once-per-tile arrivals only (the fence it costs; see above).
__device__ __forceinline__ void MbarrierArriveClusterRelease(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(SharedAddress(bar)),
      "r"(rank)
      : "memory");
}

// Writes `value` to the 32-bit word at `word`'s offset in cluster block `rank` and completes
// the phase of the mbarrier at `bar`'s offset there: one arrival that expects the 4 bytes,
// which st.async's complete_tx delivers, so a thread that sees the phase complete reads it.
__device__ __forceinline__ void PublishCluster32(uint32_t* word, uint64_t* bar, uint32_t rank, uint32_t value) {
  asm volatile(
      "{\n"
      ".reg .b32 remote_bar, remote_word;\n"
      "mapa.shared::cluster.u32 remote_bar, %0, %2;\n"
      "mapa.shared::cluster.u32 remote_word, %1, %2;\n"
      "mbarrier.arrive.expect_tx.release.cluster.shared::cluster.b64 _, [remote_bar], 4;\n"
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [remote_word], %3, [remote_bar];\n"
      "}\n" ::"r"(SharedAddress(bar)),
      "r"(SharedAddress(word)), "r"(rank), "r"(value)
      : "memory");
}

// Every non-exited thread of every block in the cluster arrives, then waits (also orders
// shared memory across the cluster: release / acquire). Threads of a warp may arrive apart.
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// TMA: one box of the tensor map at coordinates (innermost first) into shared memory;
// completion is signalled to `bar` as transaction bytes. Out-of-bounds elements read as 0.
__device__ __forceinline__ void TmaLoad2d(void* smem, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(SharedAddress(smem)),
      "l"(map), "r"(c0), "r"(c1), "r"(SharedAddress(bar))
      : "memory");
}

// TMA multicast: the box lands at the same shared-memory offset, and completes on the
// mbarrier at the same offset, in every cluster block whose bit is set in `mask`.
__device__ __forceinline__ void TmaLoad2dMulticast(void* smem, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                   uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(SharedAddress(smem)),
      "l"(map), "r"(c0), "r"(c1), "r"(SharedAddress(bar)), "h"(mask)
      : "memory");
}

__device__ __forceinline__ void TmaLoad3dMulticast(void* smem, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                                   int c2, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
      "[%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(SharedAddress(smem)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(SharedAddress(bar)), "h"(mask)
      : "memory");
}

__device__ __forceinline__ void TmaLoad3d(void* smem, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(SharedAddress(smem)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(SharedAddress(bar))
      : "memory");
}

// TMA store: one box from shared memory to the tensor map's coordinates; elements outside
// the tensor are not written. Tracked by bulk groups (BulkCommitGroup / BulkWaitGroupRead).
__device__ __forceinline__ void TmaStore2d(const CUtensorMap* map, const void* smem, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map),
               "r"(SharedAddress(smem)), "r"(c0), "r"(c1)
               : "memory");
}

__device__ __forceinline__ void TmaStore3d(const CUtensorMap* map, const void* smem, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(map),
               "r"(SharedAddress(smem)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}

__device__ __forceinline__ void BulkCommitGroup() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's bulk groups still read shared memory.
template <int kPending>
__device__ __forceinline__ void BulkWaitGroupRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// A 32-bit store to a shared-memory address (a plain pointer store can lose the address
// space and become a slower generic ST).
__device__ __forceinline__ void StoreShared32(uint32_t addr, uint32_t value) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(value) : "memory");
}

// Two 32-bit words to an 8-byte aligned shared-memory address.
__device__ __forceinline__ void StoreShared64(uint32_t addr, uint32_t lo, uint32_t hi) {
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(addr), "r"(lo), "r"(hi) : "memory");
}

// Four 8 x 8 matrices of 16-bit values to shared memory (stmatrix): lane t gives the address
// of row t % 8 of matrix t / 8, and holds, in word i, two adjacent columns of matrix i
// (row lane / 4, columns 2 (lane % 4) and + 1): the layout of an mma / wgmma accumulator.
__device__ __forceinline__ void StoreMatrixX4(uint32_t addr, uint32_t m0, uint32_t m1, uint32_t m2, uint32_t m3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(m0), "r"(m1),
               "r"(m2), "r"(m3)
               : "memory");
}

// A 32-bit load from a shared-memory address (see StoreShared32). Volatile, so that the
// compiler keeps it after the barrier that publishes the data (a plain asm without a memory
// operand could be moved across it).
__device__ __forceinline__ uint32_t LoadShared32(uint32_t addr) {
  uint32_t value;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(addr));
  return value;
}

// Two 32-bit words from an 8-byte aligned shared-memory address (as LoadShared32).
__device__ __forceinline__ uint2 LoadShared64(uint32_t addr) {
  uint2 value;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(value.x), "=r"(value.y) : "r"(addr));
  return value;
}

// Makes this thread's ordinary shared-memory writes visible to the async proxy (TMA).
__device__ __forceinline__ void FenceProxyAsyncShared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Cross-block signalling in global memory (stream-K's partial tiles). The signalling thread
// first syncs with the threads whose writes it publishes (a barrier), then fences at GPU
// scope and increments the flag; the waiting thread reads the flag with acquire semantics
// and then releases its peers with a barrier.
__device__ __forceinline__ void SignalGpu(uint32_t* flag) {
  asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.u32 [%0], 1;\n" ::"l"(flag) : "memory");
}
__device__ __forceinline__ uint32_t LoadAcquireGpu(const uint32_t* flag) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
  return v;
}

// TMA im2col mode on a 4-D (C, W, H, N) map: the box's pixel walk starts at (w, h, n) and
// each visited position reads channels [c, c + channelsPerPixel) of the pixel shifted by
// (off_w, off_h), zeros outside the tensor (gemm/sm90/tensor_map.h has the walk).
__device__ __forceinline__ void TmaLoadIm2col4d(void* smem, const CUtensorMap* map, uint64_t* bar, int c, int w,
                                                int h, int n, uint16_t off_w, uint16_t off_h) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6], {%7, %8};\n" ::"r"(SharedAddress(smem)),
      "l"(map), "r"(c), "r"(w), "r"(h), "r"(n), "r"(SharedAddress(bar)), "h"(off_w), "h"(off_h)
      : "memory");
}

__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// Orders this warpgroup's register writes before the wgmma that reads them.
__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void WgmmaCommitGroup() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most kPending committed wgmma groups are still in flight.
template <int kPending>
__device__ __forceinline__ void WgmmaWaitGroup() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

template <int kRegisters>
__device__ __forceinline__ void SetMaxRegistersIncrease() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

template <int kRegisters>
__device__ __forceinline__ void SetMaxRegistersDecrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

#endif  // JG_SM90_ENABLED

// wgmma matrix descriptor for a 128-byte-swizzled operand tile (layout type 1):
// start address, leading- and stride-dimension byte offsets, all in 16-byte units.
// K-major: rows of 64 16-bit elements (128 B), 8-row groups `stride_bytes` apart.
// MN-major: rows of 64 MN-elements per k, 8-k groups `stride_bytes` apart and 64-wide MN
// blocks `leading_bytes` apart.
__host__ __device__ constexpr uint64_t SmemDescriptorSw128(uint32_t smem_address, uint32_t leading_bytes,
                                                           uint32_t stride_bytes) {
  return uint64_t((smem_address & 0x3FFFF) >> 4) | (uint64_t(leading_bytes >> 4) << 16) |
         (uint64_t(stride_bytes >> 4) << 32) | (uint64_t(1) << 62);
}

}  // namespace jaxgemm
