"""Log records from inside a run's worker processes (run/logs.py): a spawned or forkserver worker (a parallel
agent, a local rank, an actor) started with no handler, so a warning from it reached Python's last-resort handler,
a bare line on stderr and none in train.log; and ``rltrain.train`` wrote no train.log at all."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import run_cli
from tests.test_tool_wording import C51_AT_ITS_END

SAID = "algo.distributional=c51: the mean Q"
# the C51 warning comes from the learner (algos/dqn.py), which runs in each agent's process
PARALLEL = [*C51_AT_ITS_END, "trainer=parallel", "trainer.num_agents=2", "total_env_steps=2560",
            "algo.learning_starts=200", "algo.target_network_frequency=200"]


@pytest.mark.parametrize("start_method", ["spawn", "forkserver", "fork"])
def test_an_agent_process_says_its_warnings_as_the_run_does_and_in_train_log(tmp_path, start_method):
    res = run_cli([*PARALLEL, f"trainer.start_method={start_method}", f"hydra.run.dir={tmp_path / 'run'}"],
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    said = [ln for ln in res.stderr.splitlines() if SAID in ln]
    assert len(said) == 2 and all(ln.startswith(f"rltrain: warning: {SAID}") for ln in said), res.stderr[-3000:]
    assert SAID not in res.stdout, res.stdout[-2000:]
    logged = [ln for ln in (tmp_path / "run" / "train.log").read_text().splitlines() if SAID in ln]
    assert len(logged) == 2 and all(f"[rltrain.algos.dqn][WARNING] - {SAID}" in ln for ln in logged), logged


API_RUN = "import sys, rltrain; rltrain.train(sys.argv[2:], run_dir=sys.argv[1])"


def test_the_api_writes_train_log_with_the_agents_records_too(tmp_path):
    api = subprocess.run([sys.executable, "-c", API_RUN, str(tmp_path / "api"), *PARALLEL,
                          "trainer.start_method=spawn"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert api.returncode == 0, api.stderr[-3000:]
    assert len([ln for ln in api.stderr.splitlines() if ln.startswith(f"rltrain: warning: {SAID}")]) == 2, \
        api.stderr[-3000:]
    logged = [ln for ln in (tmp_path / "api" / "train.log").read_text().splitlines() if SAID in ln]
    assert len(logged) == 2 and all(f"[rltrain.algos.dqn][WARNING] - {SAID}" in ln for ln in logged), logged


def test_an_api_run_that_logs_nothing_still_has_its_train_log(tmp_path):
    import rltrain

    result = rltrain.train(["debug=smoke", "logger=quiet", "logger.progress=off", "total_env_steps=256"],
                           run_dir=tmp_path / "run")
    assert result.summary["status"] == "completed"
    assert (tmp_path / "run" / "train.log").read_text() == ""
