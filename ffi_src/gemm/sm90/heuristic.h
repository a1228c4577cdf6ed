// The Hopper heuristic (heuristic.cu): the schedule, split and grid of a problem, computed on
// the host from its shape alone.
#pragma once
#include <cstdint>

#include "gemm/problem.h"

namespace jaxgemm {

// A schedule, by the output area one block or cluster covers: a row of kSm90Schedules
// (schedules.h).
struct Sm90Tile {
  int m, n;
};

// Products of at most this many rows stream B (the few-row rule, FewRowsSm90).
constexpr int64_t kSm90FewRows = 64;

// The schedule for a problem (with its split_k). `with_narrow`: 128x64 may be picked
// (GEMMs; convolutions pick it by their own rule).
Sm90Tile ChooseSm90Tile(const GemmProblem& p, int sm_count, bool with_narrow = true);

// The SMs the persistent grid of the heuristic's schedule is planned for: `sm_count`, or,
// for a few-row product at one slab, tiles x share, where each 64 x 64 tile is shared out
// stream-K by the workers a split would have used.
int Sm90GridSms(const GemmProblem& p, int sm_count);

// Whether (tile_m, tile_n) names a schedule.
bool IsSm90Tile(int tile_m, int tile_n);

// For the split-K choice (dispatch.cu): the few-row rule's split, and the cost of the
// cheapest schedule at p's split_k.
int64_t Sm90FewRowsSplitK(const GemmProblem& p, int sm_count);
double Sm90CheapestCost(const GemmProblem& p, int sm_count);

}  // namespace jaxgemm
