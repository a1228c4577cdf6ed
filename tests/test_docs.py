"""Every Python block of README.md and docs/*.md runs as written: a file's blocks in order,
in one namespace (as a reader types them), in a fresh process with 8 host devices and
jaxgemm's default CPU route (what a user gets, not the tests' FFI route)."""

import glob
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

# Runs the blocks given as (line, source) pairs on stdin; names the failing block's line.
DRIVER = """
import json, sys, traceback
blocks, namespace = json.load(sys.stdin), {"__name__": "__main__"}
for line, source in blocks:
    try:
        exec(compile(source, f"{sys.argv[1]}, block at line {line}", "exec"), namespace)
    except Exception:
        traceback.print_exc()
        sys.exit(f"{sys.argv[1]}: the block at line {line} failed")
print(f"{len(blocks)} blocks ran")
"""


def python_blocks(path):
    """(line, source) of each ```python block in the Markdown file at `path`."""
    text = open(path, encoding="utf-8").read()
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in FENCE.finditer(text)]


DOCS = [os.path.relpath(p, ROOT) for p in [os.path.join(ROOT, "README.md"), *sorted(glob.glob(f"{ROOT}/docs/*.md"))]]


def test_the_blocks_are_found():
    assert len(python_blocks(os.path.join(ROOT, "README.md"))) >= 4  # (the fence pattern still matches)


@pytest.mark.parametrize("doc", [d for d in DOCS if python_blocks(os.path.join(ROOT, d))])
def test_python_blocks_run_as_written(doc):
    blocks = python_blocks(os.path.join(ROOT, doc))
    env = {k: v for k, v in os.environ.items() if k not in ("JAXGEMM_CPU", "JAXGEMM_POISON_OUTPUTS")}
    if "--xla_force_host_platform_device_count" not in env.get("XLA_FLAGS", ""):
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    done = subprocess.run([sys.executable, "-P", "-c", DRIVER, doc], input=json.dumps(blocks), capture_output=True,
                          text=True, cwd=os.path.dirname(ROOT), env=env, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().endswith(f"{len(blocks)} blocks ran")
