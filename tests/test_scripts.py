"""The benchmark scripts keep working: a quick run of bench_throughput prints its side-by-side table."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO


def test_bench_throughput_quick_prints_the_table():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RLTRAIN_SB3_PYTHON", None)
    out = subprocess.run([sys.executable, "scripts/bench_throughput.py", "--quick", "--only", "env,train,sb3"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in out.stdout.splitlines() if line.startswith("| ") and "---" not in line}
    assert {"env", "train", "sb3"} <= set(rows), out.stdout
    env_sps = float(rows["env"].split("|")[3].replace(",", ""))
    train_sps = float(rows["train"].split("|")[3].replace(",", ""))
    assert 0 < train_sps < env_sps  # training can never outrun random actions on the same envs
    assert "skipped" in rows["sb3"] and "--sb3-python" in rows["sb3"]  # no SB3 here: said, not silently dropped
