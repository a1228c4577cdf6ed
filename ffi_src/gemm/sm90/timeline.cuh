// A debugging aid for the sm90 kernel's fixed cost: with JAXGEMM_TIMELINE=1 in the
// environment, each block records the GPU's global timer at a few points of its first two
// work items, and the launcher waits for the kernel and prints, per point, when the blocks
// reached it (microseconds after the first block entered). Off (a null pointer) otherwise;
// the kernel then only tests a kernel parameter at those points. tools/sm90_timeline.py.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace jaxgemm {

// Boxes of consumer 0's first whole item whose handed stores the timeline records.
constexpr int kTimelineBoxes = 8;

enum Sm90TimelineEvent : int {
  kTimelineEntry = 0,          // thread 0 enters the kernel
  kTimelineStarted,            // thread 0 is past the barrier initialization and the block (cluster) sync
  kTimelineProducerRegisters,  // the producer thread is past setmaxnreg
  kTimelineProducerItem,       // the producer has its first work item (the schedule's arithmetic)
  kTimelineProducerAcquired,   // the producer has armed the first stage (before its TMA loads)
  kTimelineProducerLoads,      // the producer has issued the first stage's TMA loads
  kTimelineConsumerRegisters,  // consumer 0's first thread is past setmaxnreg
  kTimelineConsumerItem,       // consumer 0 has its first work item (past setmaxnreg and the schedule)
  kTimelineConsumerWaits,      // consumer 0 starts waiting for its first stage
  kTimelineFirstData,          // consumer 0 sees its first stage full
  kTimelineMainloopDone,       // consumer 0's first item: the last wgmma is complete
  kTimelineEpilogueIssued,     // consumer 0's first item: the epilogue has issued its last store
  kTimelineMainloop2Done,      // the same two points of consumer 0's second item
  kTimelineEpilogue2Issued,
  kTimelineConsumer0Exit,      // consumer 0 leaves (its stores have read shared memory)
  kTimelineConsumer1Exit,      // consumer 1 leaves
  // Consumer 0's handed TMA stores (Sm90StoreWarp) of its first whole item, boxes
  // 0 .. kTimelineBoxes - 1: the store warp sees box c written, and the box's store has read it.
  kTimelineBoxWritten,
  kTimelineBoxRead = kTimelineBoxWritten + kTimelineBoxes,
  kTimelineEvents = kTimelineBoxRead + kTimelineBoxes
};

struct Sm90Timeline {
  unsigned long long* stamps;  // kTimelineEvents per block; null: off

#if defined(__CUDACC__)
  __device__ __forceinline__ void Record(int event) const {
    if (stamps == nullptr) return;
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    stamps[blockIdx.x * kTimelineEvents + event] = now;
  }
#endif
};

// A timeline for `blocks` blocks when JAXGEMM_TIMELINE is set and the stream is not being
// captured into a graph (the report waits for the kernel); off otherwise.
inline Sm90Timeline BeginSm90Timeline(int64_t blocks, cudaStream_t stream) {
  static unsigned long long* buffer = nullptr;
  static int64_t capacity = 0;
  if (std::getenv("JAXGEMM_TIMELINE") == nullptr) return {};
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) return {};
  const int64_t count = blocks * kTimelineEvents;
  if (count > capacity) {
    if (buffer) cudaFree(buffer);
    buffer = nullptr, capacity = 0;
    if (cudaMalloc(&buffer, count * sizeof(unsigned long long)) != cudaSuccess) return {};
    capacity = count;
  }
  if (cudaMemsetAsync(buffer, 0, count * sizeof(unsigned long long), stream) != cudaSuccess) return {};
  return {buffer};
}

// Waits for the kernel and prints min / median / max over blocks of each event's time.
inline void ReportSm90Timeline(const Sm90Timeline& timeline, int64_t blocks, const char* what,
                               cudaStream_t stream) {
  if (timeline.stamps == nullptr) return;
  std::vector<unsigned long long> stamps(blocks * kTimelineEvents);
  if (cudaStreamSynchronize(stream) != cudaSuccess ||
      cudaMemcpy(stamps.data(), timeline.stamps, stamps.size() * sizeof(stamps[0]), cudaMemcpyDeviceToHost) !=
          cudaSuccess) {
    return;
  }
  unsigned long long origin = ~0ull;
  for (int64_t b = 0; b < blocks; ++b) origin = std::min(origin, stamps[b * kTimelineEvents + kTimelineEntry]);
  static const char* kNames[kTimelineBoxWritten] = {
      "entry",         "started",         "producer regs",   "producer item",     "producer armed",
      "first loads",   "consumer regs",   "consumer item",   "consumer waits",    "first data",
      "mainloop done", "epilogue issued", "2nd mainloop done", "2nd epi issued", "consumer 0 exit",
      "consumer 1 exit"};
  std::fprintf(stderr, "jaxgemm timeline: %s, %lld blocks (us after the first entry: min / median / max)\n", what,
               static_cast<long long>(blocks));
  for (int e = 0; e < kTimelineEvents; ++e) {
    std::vector<double> t;
    for (int64_t b = 0; b < blocks; ++b) {
      const unsigned long long s = stamps[b * kTimelineEvents + e];
      if (s != 0) t.push_back((s - origin) * 1e-3);
    }
    if (t.empty()) continue;
    std::sort(t.begin(), t.end());
    char box_name[24];
    if (e >= kTimelineBoxWritten) {
      const bool read = e >= kTimelineBoxRead;
      std::snprintf(box_name, sizeof(box_name), "box %d %s", e - (read ? kTimelineBoxRead : kTimelineBoxWritten),
                    read ? "read" : "written");
    }
    std::fprintf(stderr, "  %-16s %8.2f %8.2f %8.2f\n", e >= kTimelineBoxWritten ? box_name : kNames[e], t.front(),
                 t[t.size() / 2], t.back());
  }
}

}  // namespace jaxgemm
