"""The sm90 heuristic's picks over a grid of problems, computed on the host (no GPU needed:
jaxgemm built with its CUDA handlers): dump them before and after a change to sm90/heuristic.cu,
then diff the two dumps to see which problems the change moves.
    python3 -P tools/heuristic_picks.py dump before.json
    (rebuild)
    python3 -P tools/heuristic_picks.py dump after.json
    python3 -P tools/heuristic_picks.py diff before.json after.json [--layout NN]
`dump --out-f32` asks for 16-bit inputs writing float32 products (default: 16-bit products)."""

import argparse
import collections
import itertools
import json

from jaxgemm import _ffi

SIZES = [64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
KS = [64, 256, 512, 1024, 2048, 4096, 8192, 14336]
LAYOUTS = {"NN": (False, False), "TN": (True, False), "NT": (False, True), "TT": (True, True)}


def dump(path: str, sms: int, out_f32: bool = False) -> None:
    picks = {}
    for m, n, k in itertools.product(SIZES, SIZES, KS):
        for layout, (ta, tb) in LAYOUTS.items():
            for tf32 in (False, True):
                tile_m, tile_n, split = _ffi.sm90_choice(m, n, k, 1, sms, tf32, ta, tb, out_f32)
                grid = _ffi.sm90_grid_sms(m, n, k, 1, sms, split, tf32, ta, tb)
                key = f"{m}x{n}x{k} {layout}{' tf32' if tf32 else ''}"
                picks[key] = [tile_m, tile_n, split, grid]
    with open(path, "w") as f:
        json.dump(picks, f)
    print(f"{len(picks)} problems -> {path}")


def diff(before_path: str, after_path: str, layout: str | None) -> None:
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)
    changed = [(key, before[key], after[key]) for key in before if key in after and before[key] != after[key]]
    if layout:
        changed = [c for c in changed if c[0].split()[1] == layout]
    print(f"{len(changed)} of {len(before)} picks change (tile_m, tile_n, split_k, grid SMs)")
    for (old, new), count in collections.Counter((tuple(b), tuple(a)) for _, b, a in changed).most_common():
        print(f"  {count:5d}  {old} -> {new}")
    for key, old, new in changed:
        print(f"{key:28s} {old} -> {new}")


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump")
    d.add_argument("path")
    d.add_argument("--sms", type=int, default=132)
    d.add_argument("--out-f32", action="store_true", help="16-bit inputs write float32 products")
    c = sub.add_parser("diff")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("--layout", choices=sorted(LAYOUTS))
    args = parser.parse_args()
    if args.command == "dump":
        dump(args.path, args.sms, args.out_f32)
    else:
        diff(args.before, args.after, args.layout)


if __name__ == "__main__":
    main()
