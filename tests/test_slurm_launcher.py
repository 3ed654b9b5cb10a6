"""The SLURM launcher's refusals without a cluster: sbatch's refusals (a stand-in ``sbatch`` on PATH), a
multi-task SLURM step under a trainer that runs in one process, and the plugin without the submitit package.
Each is one line on stderr and exit 2, never a traceback. (tests/test_slurm.py runs the rest on a real SLURM.)"""

from __future__ import annotations

import importlib.util
import os
import stat

import pytest

from rltrain.errors import ConfigError
from rltrain.run.lock import check_ranks
from rltrain.sweeps.slurm import hopeless_reason, sbatch_refusal
from tests.conftest import run_cli
from tests.helpers.sweeps import TINY

needs_submitit = pytest.mark.skipif(importlib.util.find_spec("submitit") is None, reason="needs the 'slurm' extra")

REFUSALS = [
    ("sbatch: error: invalid partition specified: nosuch\nsbatch: error: Batch job submission failed: Invalid "
     "partition name specified", "hydra.launcher.partition"),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available",
     "hydra.launcher.mem_gb"),
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
     "sinfo"),
]


def _fake_slurm(bin_dir, said: str) -> None:
    """An ``sbatch`` that refuses with ``said`` and an ``sinfo`` that lists two partitions, first on PATH."""
    bin_dir.mkdir(exist_ok=True)
    for name, script in (("sbatch", f"cat >&2 <<'EOF'\n{said}\nEOF\nexit 1"), ("sinfo", "printf 'debug\\ngpu\\n'")):
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\n{script}\n")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize(("said", "key"), REFUSALS)
def test_sbatch_refusal_names_what_sbatch_said_and_the_key(said, key, tmp_path, monkeypatch):
    _fake_slurm(tmp_path / "bin", said)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    line = sbatch_refusal(said, params={"partition": "nosuch", "mem_gb": 100000, "cpus_per_task": 2,
                                        "tasks_per_node": 1, "nodes": 1, "gpus_per_node": None})
    assert "\n" not in line and key in line
    first = said.splitlines()[0].removeprefix("sbatch: error: ").removeprefix("Batch job submission failed: ")
    assert first in line  # what sbatch said, as it said it
    # the cluster's partitions where the partition is what to change, and only there (sinfo waits out a dead
    # controller's retries)
    assert ("(this cluster's: debug, gpu)" in line) == (key == "hydra.launcher.partition"), line


@needs_submitit
@pytest.mark.parametrize(("said", "key"), REFUSALS)
def test_an_sbatch_refusal_is_one_line_exit_2_and_leaves_no_sweep_dir(tmp_path, said, key):
    bin_dir = tmp_path / "bin"
    _fake_slurm(bin_dir, said)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    res = run_cli(["-m", "hydra/launcher=slurm", "seed=1,2", *TINY, "hydra.sweep.dir=sweep"], cwd=tmp_path, env=env,
                  timeout=120)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("rltrain: error: sbatch refused"), res.stderr[-3000:]
    assert key in lines[0]
    assert not (tmp_path / "sweep").exists()  # no multirun.yaml, no .submitit/ of a sweep that never was


def test_a_multi_task_slurm_step_needs_a_trainer_that_takes_ranks():
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2"}
    with pytest.raises(ConfigError, match=r"trainer=sequential .*2 tasks.*distributed_simulator"):
        check_ranks(trainer="sequential", takes_ranks=False, env=env)
    check_ranks(trainer="distributed_simulator", takes_ranks=True, env=env)
    check_ranks(trainer="sequential", takes_ranks=False, env={"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    with pytest.raises(ConfigError, match="torchrun"):
        check_ranks(trainer="sequential", takes_ranks=False, env={"RANK": "0", "WORLD_SIZE": "2"})


def test_rank_1_of_a_sequential_run_is_refused_before_it_writes(tmp_path):
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7", "SLURM_NODELIST": "localhost"}
    res = run_cli([*TINY, "hydra.run.dir=run"], cwd=tmp_path, env=env, timeout=120)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "trainer=sequential" in lines[0] and "distributed_simulator" in lines[0]
    assert not (tmp_path / "run" / "summary.json").exists()


def test_pending_reasons_that_never_start_are_named():
    assert "hydra.launcher.cpus_per_task" in hopeless_reason("PartitionConfig")
    assert "hydra.launcher.timeout_min" in hopeless_reason("PartitionTimeLimit")
    assert hopeless_reason("Resources") is None and hopeless_reason("Priority") is None


@needs_submitit
def test_the_slurm_launcher_without_submitit_names_the_extra(tmp_path):
    shadow = tmp_path / "shadow" / "submitit"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'submitit'\", name='submitit')\n")
    env = {"PYTHONPATH": str(tmp_path / "shadow")}
    res = run_cli(["-m", "hydra/launcher=slurm", "seed=1", *TINY, "hydra.sweep.dir=sweep"], cwd=tmp_path, env=env,
                  timeout=120)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == ["rltrain: error: submitit_slurm needs the 'slurm' extra: pip install 'rltrain[slurm]'"], lines
