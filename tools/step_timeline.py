"""The GPU timeline of one step of tools/bench_parallel.py's workloads, for each backend.

Traces one step (after warm-up) with jax.profiler (CUPTI), reads the trace back and
prints, for the first GPU: every kernel in start order with its stream, duration and
whether it ran while a NCCL kernel was running, then per backend the totals: step span,
GEMM time with and without a collective beside it, NCCL time. It answers "which kernels
lose time when the all-reduces overlap them".
    python3 -P tools/step_timeline.py --devices 2 [--workload dp|tp] [--out DIR] [--all] [--hlo]
"""

import argparse
import glob
import os
import re
import sys
import tempfile

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_parallel as bp

# Kernel names counted as GEMMs: cuBLAS's and cuDNN's, and every jaxgemm kernel (its
# namespace), the fused backward's elementwise one included.
GEMM_MARKERS = ("Gemm", "gemm", "nvjet", "xmma", "cutlass", "Conv")


def kind_of(name: str) -> str:
    if "nccl" in name.lower():
        return "nccl"
    return "gemm" if any(m in name for m in GEMM_MARKERS) else "other"


def trace_step(fn, args, out_dir: str) -> str:
    jax.block_until_ready(fn(*args))
    with jax.profiler.trace(out_dir):
        jax.block_until_ready(fn(*args))
    paths = glob.glob(os.path.join(out_dir, "**", "*.xplane.pb"), recursive=True)
    return max(paths, key=os.path.getmtime)


def kernels_of(path: str, device: str = "/device:GPU:0") -> list:
    """(start_ns, end_ns, stream line name, kernel name) of every kernel on `device`."""
    data = jax.profiler.ProfileData.from_file(path)
    plane = data.find_plane_with_name(device)
    events = []
    if plane is None:
        raise SystemExit(f"no plane {device} in {path}: {[p.name for p in data.planes]}")
    for line in plane.lines:
        if "Stream" not in line.name:  # not "XLA Ops", "XLA Modules", ...: those repeat the kernels
            continue
        for e in line.events:
            events.append((e.start_ns, e.end_ns, line.name, e.name, dict(e.stats)))
    return sorted(events)


def overlaps(event, others) -> float:
    """The fraction of `event`'s duration during which any of `others` runs."""
    start, end = event[0], event[1]
    covered = 0.0
    for o_start, o_end, *_ in others:
        covered += max(0.0, min(end, o_end) - max(start, o_start))
    return min(1.0, covered / max(1.0, end - start))


SCHEDULED = re.compile(r"^\s*(?:ROOT )?%(\S+) = .*? (custom-call|all-reduce-start|all-reduce-done|all-reduce|"
                       r"reduce-scatter|all-gather-start|all-gather-done)\((.*)$")


def print_schedule(hlo: str) -> None:
    """The entry computation's GEMMs and collectives in their scheduled order."""
    entry = hlo[hlo.index("\nENTRY"):]
    entry = entry[: entry.index("\n}")]
    for line in entry.splitlines():
        m = SCHEDULED.match(line)
        if not m:
            continue
        target = re.search(r'custom_call_target="([^"]+)"', line)
        operands = re.findall(r"%([\w.-]+)", m.group(3).split("), ")[0])
        print(f"  {m.group(2):18s} {m.group(1)[:28]:28s} {target.group(1) if target else ''}"
              f"  <- {', '.join(operands)[:110]}")


def report(backend: str, events: list, show_all: bool) -> dict:
    nccl = [e for e in events if kind_of(e[3]) == "nccl"]
    t0 = events[0][0]
    totals = {"gemm_alone": 0.0, "gemm_beside_nccl": 0.0, "nccl": 0.0, "other": 0.0}
    print(f"\n== {backend}: {len(events)} kernels on GPU 0 ==")
    for e in events:
        kind, us = kind_of(e[3]), (e[1] - e[0]) / 1e3
        shared = overlaps(e, nccl) if kind != "nccl" else 0.0
        if kind == "gemm":
            totals["gemm_beside_nccl" if shared > 0.5 else "gemm_alone"] += us
        else:
            totals[kind] += us
        if show_all or kind != "other":
            grid = re.search(r"grid:(\d+)", str(e[4].get("kernel_details", "")))
            print(f"{(e[0] - t0) / 1e3:9.1f} us  {us:8.1f} us  {kind:5s} beside-nccl {shared:4.0%}  "
                  f"grid {grid.group(1) if grid else '?':>5s}  {e[2][:14]:14s} {e[3][:80]}")
    totals["span"] = (max(e[1] for e in events) - t0) / 1e3
    print("totals (us): " + ", ".join(f"{k} {v:.0f}" for k, v in totals.items()))
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--workload", choices=("dp", "tp"), default="dp")
    parser.add_argument("--out", default=None, help="where the traces go (default: a temporary folder)")
    parser.add_argument("--hlo", action="store_true", help="print the schedule; write the HLO into --out")
    parser.add_argument("--all", action="store_true", help="list every kernel, not only GEMMs and NCCL's")
    args = parser.parse_args()
    sizes = bp.SMALL if jax.default_backend() == "cpu" else bp.FULL
    workload = bp.WORKLOADS[args.workload]
    inputs, specs = workload.inputs(sizes, jax.random.key(0))
    in_shardings, out_shardings = bp.shardings(workload, specs, args.devices)
    step_args = jax.device_put(inputs, in_shardings)
    out_root = args.out or tempfile.mkdtemp(prefix="step_timeline_")
    os.makedirs(out_root, exist_ok=True)
    summary = {}
    for backend in bp.BACKENDS:
        fn = jax.jit(workload.build(bp.DENSE[backend]), in_shardings=in_shardings, out_shardings=out_shardings)
        compiled = fn.lower(*step_args).compile()
        if args.hlo:
            with open(os.path.join(out_root, f"{backend}.hlo"), "w") as f:
                f.write(compiled.as_text())
            print(f"\n== {backend}: scheduled GEMMs and collectives ==")
            print_schedule(compiled.as_text())
        path = trace_step(compiled, step_args, os.path.join(out_root, backend))
        summary[backend] = report(backend, kernels_of(path), args.all)
    print(f"\n{args.workload} on {args.devices} devices, us: " + "; ".join(
        f"{b}: " + ", ".join(f"{k} {v:.0f}" for k, v in t.items()) for b, t in summary.items()))


if __name__ == "__main__":
    main()
