"""The GPU timeline of tools/bench_parallel.py's workloads, for each backend.

Traces --steps steps (after warm-up; each called and waited for as bench_parallel times
them, inside a host annotation) with jax.profiler (CUPTI), reads the trace back and prints:
  - where each step's wall clock goes, per GPU: from the host's call to the GPU's first
    kernel (launch), first to last kernel (span) and the idle time inside it, last kernel
    to the host's return (tail); medians over the steps. It answers "is the step longer
    than its kernels, and on which GPU";
  - for the last step on the first GPU: every kernel in start order with its stream,
    duration and whether it ran while a NCCL kernel was running, then the totals: GEMM
    time with and without a collective beside it, NCCL time. It answers "which kernels
    lose time when the all-reduces overlap them".
    python3 -P tools/step_timeline.py --devices 2 [--workload dp|tp|sp] [--steps 5] [--out DIR] [--all] [--hlo]
"""

import argparse
import glob
import os
import re
import statistics
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


STEP = "timed_step_"  # the host annotation around each traced step


def trace_steps(fn, args, out_dir: str, steps: int) -> jax.profiler.ProfileData:
    jax.block_until_ready(fn(*args))
    with jax.profiler.trace(out_dir):
        for i in range(steps):
            with jax.profiler.TraceAnnotation(f"{STEP}{i}"):
                jax.block_until_ready(fn(*args))
    paths = glob.glob(os.path.join(out_dir, "**", "*.xplane.pb"), recursive=True)
    return jax.profiler.ProfileData.from_file(max(paths, key=os.path.getmtime))


def host_steps(data) -> list:
    """(start_ns, end_ns) of each traced step's host call, in order."""
    plane = data.find_plane_with_name("/host:CPU")
    found = [(e.start_ns, e.start_ns + e.duration_ns) for line in plane.lines for e in line.events
             if e.name.startswith(STEP)]  # fmt: skip
    return sorted(found)


def gpu_planes(data) -> list:
    return sorted(p.name for p in data.planes if p.name.startswith("/device:GPU:"))


def kernels_of(data, device: str) -> list:
    """(start_ns, end_ns, stream line name, kernel name, stats) of every kernel on `device`."""
    plane = data.find_plane_with_name(device)
    events = []
    for line in plane.lines:
        if "Stream" not in line.name:  # not "XLA Ops", "XLA Modules", ...: those repeat the kernels
            continue
        for e in line.events:
            events.append((e.start_ns, e.end_ns, line.name, e.name, dict(e.stats)))
    return sorted(events)


def busy_ns(events) -> float:
    """The time during which at least one of `events` runs."""
    total, reach = 0.0, None
    for start, end, *_ in sorted(events):
        if reach is None or start > reach:
            total, reach = total + end - start, end
        elif end > reach:
            total, reach = total + end - reach, end
    return total


def in_step(events, step) -> list:
    return [e for e in events if step[0] <= e[0] < step[1]]


def report_wall(backend: str, steps: list, kernels: dict) -> None:
    """Per GPU, medians over the steps: host call, launch, span, idle inside it, tail (ms)."""
    print(f"\n== {backend}: where each step's wall clock goes (ms, medians of {len(steps)} steps) ==")
    print(f"  host call {statistics.median((e - s) / 1e6 for s, e in steps):.3f}")
    for device, events in kernels.items():
        rows = []
        for step in steps:
            mine = in_step(events, step)
            if mine:
                first, last = mine[0][0], max(e[1] for e in mine)
                rows.append(((first - step[0]) / 1e6, (last - first) / 1e6,
                             (last - first - busy_ns(mine)) / 1e6, (step[1] - last) / 1e6))  # fmt: skip
        if not rows:
            print(f"  {device}: no kernel inside the host's calls (clocks not aligned?)")
            continue
        launch, span, idle, tail = (statistics.median(col) for col in zip(*rows))
        print(f"  {device}: launch {launch:.3f}  span {span:.3f} (idle {idle:.3f})  tail {tail:.3f}")


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
    print(f"\n== {backend}: {len(events)} kernels of the last step on GPU 0 ==")
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
    parser.add_argument("--workload", choices=("dp", "tp", "sp"), default="dp")
    parser.add_argument("--steps", type=int, default=5, help="steps traced, each waited for")
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
        compiled = bp.compile_case(workload, backend, in_shardings, out_shardings, step_args)
        if args.hlo:
            with open(os.path.join(out_root, f"{backend}.hlo"), "w") as f:
                f.write(compiled.as_text())
            print(f"\n== {backend}: scheduled GEMMs and collectives ==")
            print_schedule(compiled.as_text())
        data = trace_steps(compiled, step_args, os.path.join(out_root, backend), args.steps)
        steps, gpus = host_steps(data), gpu_planes(data)
        if not gpus:
            print(f"\n{backend}: host calls {[round((e - s) / 1e6, 3) for s, e in steps]} ms; no GPU in the trace")
            continue
        kernels = {device: kernels_of(data, device) for device in gpus}
        report_wall(backend, steps, kernels)
        # Clocks not aligned: the step's kernels are the last of each step's equal share.
        first_gpu = kernels[gpus[0]]
        last = in_step(first_gpu, steps[-1]) or first_gpu[-(len(first_gpu) // len(steps)):]
        summary[backend] = report(backend, last, args.all)
    print(f"\n{args.workload} on {args.devices} devices, us: " + "; ".join(
        f"{b}: " + ", ".join(f"{k} {v:.0f}" for k, v in t.items()) for b, t in summary.items()))


if __name__ == "__main__":
    main()
