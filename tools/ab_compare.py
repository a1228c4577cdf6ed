"""Row by row, two benchmark JSONs of the same cases (jaxgemm.bench or jaxgemm.bench.conv --json),
from two builds run one after the other on one GPU: our time B / A, and XLA's B / A (the
same XLA both times, so its ratio is the run-to-run drift that ours is read against).
    python3 tools/ab_compare.py A.json B.json [--tolerance 0.02]"""

import argparse
import json
import math


def times(row: dict) -> dict:
    """{measurement: (ours ms, XLA ms)} of one row: a GEMM case, or a conv layer's passes."""
    if "ours_ms" in row:
        return {"": (row["ours_ms"], row["xla_ms"])}
    return {f" {p}": (row[f"{p}_ours_ms"], row[f"{p}_xla_ms"]) for p in ("fprop", "fwd_bwd") if f"{p}_ours_ms" in row}


def key(row: dict) -> str:
    shape = f" {row['m']}x{row['n']}x{row['k']}" if "m" in row else ""
    shape = "" if shape.strip() in row["name"] else shape  # (shape_zoo's names hold it)
    return f"{row['name']}{shape} {row.get('dtype', '')}".strip()


def geomean(values) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--tolerance", type=float, default=0.02, help="|B/A - XLA drift| flagged above this")
    args = parser.parse_args()
    with open(args.a) as f:
        rows_a = {key(r): r for r in json.load(f)}
    with open(args.b) as f:
        rows_b = {key(r): r for r in json.load(f)}
    print(f"{'case':<52} {'A ms':>9} {'B ms':>9} {'B/A':>7} {'XLA B/A':>8}")
    ours, drift = [], []
    for name, row_a in rows_a.items():
        if name not in rows_b:
            print(f"{name:<52} only in A")
            continue
        for part, (ours_a, xla_a) in times(row_a).items():
            ours_b, xla_b = times(rows_b[name])[part]
            ratio, xla_ratio = ours_b / ours_a, xla_b / xla_a
            ours.append(ratio)
            drift.append(xla_ratio)
            flag = "  <-- slower" if ratio - xla_ratio > args.tolerance else ""
            print(f"{(name + part)[:52]:<52} {ours_a:>9.3f} {ours_b:>9.3f} {ratio:>7.3f} {xla_ratio:>8.3f}{flag}")
    if ours:
        print(f"geomean B/A: ours {geomean(ours):.4f}, XLA {geomean(drift):.4f} (B/A > 1: B slower)")


if __name__ == "__main__":
    main()
