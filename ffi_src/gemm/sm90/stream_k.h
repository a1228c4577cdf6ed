// Stream-K's walk for the persistent sm90 kernel: how a worker's range of k-tiles is cut
// into pieces of work items, and which of an item's k-tiles each piece multiplies. Host and
// device code, so that the host (tests) can check the walk the kernel takes.
#pragma once
#include <cstdint>

#include "common/fast_divmod.h"
#include "common/host_device.h"

namespace jaxgemm {

// What a consumer does with a piece's sums.
enum Sm90Fixup : int {
  kSm90Whole = 0,         // all of the item's k-tiles: the epilogue stores the tile
  kSm90StorePartial = 1,  // a range starts inside the item: the sums go to this block's workspace slot
  kSm90AddPartial = 2,    // the item's head: add the later workers' slots, then the epilogue
};

// The stream-K items' k-tiles, counted item after item, are cut into one range per worker,
// [Sm90StreamKBegin(w), Sm90StreamKBegin(w + 1)), of equal length (PlanSm90StreamK). Two
// plans:
// - a last, partly filled wave and one full wave: ranges of one to two items. A range
//   starts with the tail of an item (whose head the previous worker multiplies), maybe has
//   a whole item, and ends with the head of another (whose tail the next worker multiplies).
// - a single partly filled wave (fewer items than workers, deep K): ranges shorter than an
//   item, so an item may also have middle pieces, ranges that lie wholly inside it.
// The worker whose range holds an item's first k-tile multiplies its head last in its range
// and adds, in worker order (deterministic), the sums the item's later workers (`partners`)
// left in their workspace slots: each of them began its range with its piece of the item.
// A worker stores at most one partial tile (its first piece), so one slot each suffices.
//
// Which of an item's k-tiles a piece multiplies is free (the sum's order is fixed either
// way), and is chosen to keep the workers in step over K, so that concurrent tiles read the
// same operand slices from L2: the item's k-tiles are its stream positions rotated by the
// head's length h. The piece after the head takes k-tiles [0, ...) from time 0 of its
// range, the next one continues where it stops, and the head takes the last h, ending with
// its range; a whole item starts where the time says (k-tile t mod item_k_tiles at time t)
// and wraps around. With ranges of length L, at time t the workers multiply k-tiles
// t + j L (give or take j) or t + item_k_tiles - L: a few phases over K, the same in every
// item (a 1.5-wave product ran 2% faster than with one phase per worker).
struct Sm90StreamKPiece {
  int32_t item;      // among the stream-K items
  int32_t first_k;   // the first k-tile; after item_k_tiles - first_k of them, k-tile 0 follows
  int32_t k_tiles;
  int32_t fixup;     // Sm90Fixup
  int32_t partners;  // a head: the workers after this one whose partial sums it adds
};

// The first k-tile of worker w's range of `workers` over `sk_k_tiles` (sk_k_tiles *
// workers < 2^63).
JG_HOST_DEVICE_INLINE int32_t Sm90StreamKBegin(int64_t sk_k_tiles, int32_t w, int32_t workers) {
  return static_cast<int32_t>(sk_k_tiles * w / workers);
}

// The worker whose range holds k-tile g (0 <= g < sk_k_tiles): the last w with Begin(w) <= g.
JG_HOST_DEVICE_INLINE int32_t Sm90StreamKWorkerOf(int64_t sk_k_tiles, int32_t g, int32_t workers) {
  return static_cast<int32_t>(((int64_t{g} + 1) * workers - 1) / sk_k_tiles);
}

// The piece of worker w's range [begin, end) that starts at k-tile `iter` (begin <= iter <
// end) of the `sk_k_tiles` shared out over `workers`; item_k divides by the k-tiles of an
// item. The next piece starts at iter + k_tiles.
JG_HOST_DEVICE_INLINE Sm90StreamKPiece Sm90StreamKPieceAt(int64_t sk_k_tiles, int32_t workers, int32_t w,
                                                          int32_t begin, int32_t iter, int32_t end,
                                                          const FastDivmod& item_k) {
  const int32_t item_k_tiles = item_k.divisor;
  Sm90StreamKPiece piece;
  int32_t in_item;
  item_k.DivMod(iter, &piece.item, &in_item);
  const int32_t item_start = iter - in_item, item_end = item_start + item_k_tiles;
  piece.k_tiles = (end < item_end ? end : item_end) - iter;
  piece.partners = 0;
  if (in_item != 0) {  // the range starts inside the item (iter == begin): a tail or a middle
    piece.fixup = kSm90StorePartial;
    const int32_t head = Sm90StreamKWorkerOf(sk_k_tiles, item_start, workers);
    piece.first_k = begin - Sm90StreamKBegin(sk_k_tiles, head + 1, workers);
  } else if (piece.k_tiles < item_k_tiles) {  // the range ends inside it: its head
    piece.fixup = kSm90AddPartial;
    piece.first_k = item_k_tiles - piece.k_tiles;
    piece.partners = Sm90StreamKWorkerOf(sk_k_tiles, item_end - 1, workers) - w;
  } else {  // whole, from time iter - begin
    piece.fixup = kSm90Whole;
    int32_t passes;
    item_k.DivMod(iter - begin, &passes, &piece.first_k);
  }
  return piece;
}

}  // namespace jaxgemm
