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
  kSm90StorePartial = 1,  // the tail of a range: the sums go to this block's workspace slot
  kSm90AddPartial = 2,    // the head of a range: add the next worker's slot, then the epilogue
};

// The stream-K items' k-tiles, counted item after item, are cut into one range per worker,
// [Sm90StreamKBegin(w), Sm90StreamKBegin(w + 1)), of equal length (one to two items:
// PlanSm90StreamK). A range starts with the tail of an item (whose head the previous
// worker multiplies), maybe has a whole item, and ends with the head of another (whose tail
// the next worker multiplies): the head's worker adds the tail's sums, which the tail's
// worker left in its workspace slot early in its range, and stores the tile.
//
// Which of an item's k-tiles a piece multiplies is free (the sum's order is fixed either
// way), and is chosen to keep the workers in step over K as whole waves are, so that
// concurrent tiles read the same operand slices: at time t of its range (in k-tiles) a
// worker multiplies k-tile t mod item_k_tiles, and in the head it ends with,
// (t - range length) mod item_k_tiles. So a tail of T k-tiles takes the item's k-tiles
// [0, T), the head the rest, and a whole item starts where the time says and wraps around.
// Two phases over K instead of one per worker: a 1.5-wave product ran 2% faster (H200,
// NOTES.md session 27).
struct Sm90StreamKPiece {
  int32_t item;     // among the stream-K items
  int32_t first_k;  // the first k-tile; after item_k_tiles - first_k of them, k-tile 0 follows
  int32_t k_tiles;
  int32_t fixup;    // Sm90Fixup
};

// The first k-tile of worker w's range of `workers` over `sk_k_tiles` (sk_k_tiles *
// workers < 2^63).
JG_HOST_DEVICE_INLINE int32_t Sm90StreamKBegin(int64_t sk_k_tiles, int32_t w, int32_t workers) {
  return static_cast<int32_t>(sk_k_tiles * w / workers);
}

// The piece of the range [begin, end) that starts at k-tile `iter` (begin <= iter < end);
// item_k divides by the k-tiles of an item. The next piece starts at iter + k_tiles.
JG_HOST_DEVICE_INLINE Sm90StreamKPiece Sm90StreamKPieceAt(int32_t begin, int32_t iter, int32_t end,
                                                          const FastDivmod& item_k) {
  const int32_t item_k_tiles = item_k.divisor;
  Sm90StreamKPiece piece;
  int32_t in_item;
  item_k.DivMod(iter, &piece.item, &in_item);
  const int32_t item_end = iter - in_item + item_k_tiles;
  piece.k_tiles = (end < item_end ? end : item_end) - iter;
  if (in_item != 0) {  // the range starts inside the item: its tail, at time 0
    piece.fixup = kSm90StorePartial;
    piece.first_k = 0;
  } else if (piece.k_tiles < item_k_tiles) {  // the range ends inside it: its head
    piece.fixup = kSm90AddPartial;
    piece.first_k = item_k_tiles - piece.k_tiles;
  } else {  // whole, from time iter - begin
    piece.fixup = kSm90Whole;
    int32_t passes;
    item_k.DivMod(iter - begin, &passes, &piece.first_k);
  }
  return piece;
}

}  // namespace jaxgemm
