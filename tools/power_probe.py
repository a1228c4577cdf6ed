"""Energy, power and SM clock per GEMM while one kernel runs back to back with the GPU never
idle: jaxgemm's GEMM (the heuristic's schedule, or forced sm90 tiles) against XLA's, in
ABBA order, each for a few seconds. At the power cap a GEMM's time is its energy over the
cap, so the energy per GEMM says what a schedule costs there; the clock and the multiply-adds
per SM clock say whether a time difference is the clock or the work per clock.
    python tools/power_probe.py [M,N,K ...] [--tiles 256x256,128x256] [--f32] [--seconds 3]
    python tools/power_probe.py --bench "bf16 8192^3 dense relu,tf32 8192^3" [--seconds 3]
--f32: float32 at full precision (ours: SIMT, tiles forced on A stored as (K, M), as the
heuristic stores large operands; XLA: precision="highest").
--bench: jaxgemm.bench.gemm's cases with one of the comma-separated names (every kind), ours
against the case's baseline, one call of each per step (for cases of >= ~1 ms per call).

Each timed call is one executable of R independent GEMMs (distinct operands: XLA merges
dots that share one), sized to run >= 2 ms; at most two calls are in flight, so the device
queue never drains. NVML (the driver's libnvidia-ml, through ctypes) gives the energy
counter and, sampled every 10 ms from a thread, the SM clock, power and clock-event reasons.
Right after each window, CUPTI times the same executable's kernels (GPU still hot): "kernel
us" is their sum per GEMM, "wall us" includes the gaps between launches."""

import ctypes
import statistics
import sys
import threading
import time

import jax
import jax.numpy as jnp
from jax.experimental.mosaic.gpu import profiler

from jaxgemm.gemm import GemmConfig, gemm_product


class Nvml:
    """The few NVML queries the probe needs, on GPU 0."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.handle = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.handle)), "handle")

    @staticmethod
    def _check(rc, what):
        if rc != 0:
            raise RuntimeError(f"NVML {what} failed: {rc}")

    def energy_mj(self) -> int:
        v = ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(v)), "energy")
        return v.value

    def sample(self) -> tuple[float, float, int]:
        """(SM clock MHz, power W, clock-event reasons bit mask)."""
        clock, power, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(clock)), "clock")  # 1: SM
        self._check(self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(power)), "power")
        self._check(self.lib.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle, ctypes.byref(reasons)), "reasons")
        return float(clock.value), power.value / 1e3, reasons.value


def measure(nvml: Nvml, fn, args, seconds: float, warmup: float = 1.5):
    """(wall ms per call, J per call, median SM MHz, median W, reasons) over `seconds` of
    back-to-back calls, after `warmup` seconds of the same."""
    in_flight = []

    def run(duration):
        calls, end = 0, time.perf_counter() + duration
        while time.perf_counter() < end:
            in_flight.append(fn(*args))
            if len(in_flight) > 2:
                jax.block_until_ready(in_flight.pop(0))
            calls += 1
        return calls

    run(warmup)
    jax.block_until_ready(in_flight)
    in_flight.clear()
    samples, stop = [], threading.Event()

    def sampler():
        while not stop.is_set():
            samples.append(nvml.sample())
            time.sleep(0.01)

    thread = threading.Thread(target=sampler)
    e0, t0 = nvml.energy_mj(), time.perf_counter()
    thread.start()
    calls = run(seconds)
    jax.block_until_ready(in_flight)
    t1, e1 = time.perf_counter(), nvml.energy_mj()
    stop.set()
    thread.join()
    in_flight.clear()
    steady = samples[len(samples) // 10:] or samples  # the first tenth: the queue filling
    reasons = 0
    for s in steady:
        reasons |= s[2]
    return ((t1 - t0) / calls * 1e3, (e1 - e0) / 1e3 / calls, statistics.median(s[0] for s in steady),
            statistics.median(s[1] for s in steady), reasons)


def kernels(fn, args, iterations=3):
    """(summed kernel ms per call, median over iterations; the distinct kernel names)."""
    _, per_iter = profiler.measure(fn, aggregate=False, iterations=iterations)(*args)
    totals = [sum(ms for _, ms in it) for it in per_iter]
    names = sorted({name for name, _ in per_iter[0]})
    return statistics.median(totals), names


HEADER = (f"{'case':40s} {'wall us':>8s} {'kernel us':>9s} {'mJ':>8s} {'W':>5s} {'MHz':>5s} {'MAC/SM/clk':>10s}"
          "  reasons  kernels")


def probe(nvml, case, runs, args, seconds, repeats, macs):
    """Each (label, fn) of `runs` in ABBA order: one table row per window, per product
    (a call runs `repeats` products of `macs` multiply-adds each)."""
    sms = getattr(jax.devices()[0], "core_count", 132)
    for label, fn in runs + runs[::-1]:
        ms, joules, mhz, watts, reasons = measure(nvml, fn, args, seconds)
        kernel_ms, names = kernels(fn, args)
        wall_us, kernel_us = ms * 1e3 / repeats, kernel_ms * 1e3 / repeats
        per_clock = macs / (kernel_us * 1e-6) / (mhz * 1e6) / sms
        print(f"{f'{case} {label}':40s} {wall_us:8.1f} {kernel_us:9.1f} {joules * 1e3 / repeats:8.2f} "
              f"{watts:5.0f} {mhz:5.0f} {per_clock:10.0f}  {reasons:#5x}  {' '.join(x[:40] for x in names[:3])}",
              flush=True)


def main(shapes, tiles, f32=False, seconds=3.0):
    nvml = Nvml()
    dtype = jnp.float32 if f32 else jnp.bfloat16
    print(HEADER)
    for m, n, k in shapes:
        est_ms = 2 * m * n * k / (45e12 if f32 else 700e12) * 1e3
        repeats = max(2, min(64, int(2.0 / est_ms) + 1))
        keys = jax.random.split(jax.random.key(m + n + k), 2 * repeats)
        a_list = [jax.random.normal(key, (m, k), dtype) for key in keys[:repeats]]
        b_list = [jax.random.normal(key, (k, n), dtype) for key in keys[repeats:]]
        # Forced SIMT tiles take A stored (K, M), made outside the timing.
        a_t_list = [a.T.copy() for a in a_list] if f32 and any(tiles) else a_list
        precision = "highest" if f32 else None
        runs = [("XLA", jax.jit(lambda a_list, a_t_list, b_list: [
            jnp.dot(a, b, precision=precision) for a, b in zip(a_list, b_list)]))]
        for tile in tiles:
            label = f"ours {tile[0]}x{tile[1]}" if tile else "ours"
            if f32 and tile:
                config = GemmConfig(transpose_a=True, split_k=1, kernel="simt", tile=tile)
                runs.append((label, jax.jit(lambda a_list, a_t_list, b_list, c=config: [
                    gemm_product(a, b, c) for a, b in zip(a_t_list, b_list)])))
                continue
            config = GemmConfig(out_dtype=jnp.dtype(dtype), kernel="sm90" if tile else None, tile=tile)
            runs.append((label, jax.jit(lambda a_list, a_t_list, b_list, c=config: [
                gemm_product(a, b, c) for a, b in zip(a_list, b_list)])))
        probe(nvml, f"{m}x{n}x{k}", runs, (a_list, a_t_list, b_list), seconds, repeats, m * n * k)


def bench_cases(names, seconds):
    from jaxgemm.bench import gemm as bench

    nvml = Nvml()
    seen, cases = set(), []
    for suite in ("simt", "tc", "epilogue"):
        for case in bench.SUITES[suite]():
            if case.name in names and (case.name, case.kind) not in seen:
                seen.add((case.name, case.kind))
                cases.append(case)
    print(HEADER)
    for case in cases:
        ours, base = bench._functions(case)
        runs = [("ours", ours), (case.baseline, base)]
        probe(nvml, f"{case.name} ({case.kind})", runs, bench._inputs(case, 0), seconds, 1, case.flops / 2)


if __name__ == "__main__":
    args = sys.argv[1:]
    tiles, seconds = [None], 3.0
    if "--tiles" in args:
        i = args.index("--tiles")
        tiles = [None] + [tuple(map(int, t.split("x"))) for t in args[i + 1].split(",")]
        del args[i:i + 2]
    if "--seconds" in args:
        i = args.index("--seconds")
        seconds = float(args[i + 1])
        del args[i:i + 2]
    if "--bench" in args:
        bench_cases(args[args.index("--bench") + 1].split(","), seconds)
        sys.exit(0)
    f32 = "--f32" in args
    args = [a for a in args if a != "--f32"]
    main([tuple(map(int, s.split(","))) for s in args] or [(8192, 8192, 8192), (4096, 4096, 4096)], tiles, f32, seconds)
