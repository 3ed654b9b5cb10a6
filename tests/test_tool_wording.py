"""The tools and the Python API say what they did in their own words: the API's errors name its arguments (not
the command lines' flags), a choice it does not know is refused (never read as ``final``), its objects show what
they hold, ``rltrain-check``'s errors are one line on stderr whatever the terminal, ``rltrain-eval`` names the
actions it took, and rltrain's own ``logging`` warnings read as its printed ones (and follow
``hydra/job_logging``)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import rltrain
from rltrain.errors import ConfigError
from tests.conftest import run_cli

TINY = ["algo=ppo", "env=cartpole", "experiment=none", "algo.rollout_len=64", "total_env_steps=256",
        "env.num_envs=2", "eval.every_env_steps=0", "eval.episodes=1", "logger=quiet", "logger.progress=off"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("wording") / "run"
    rltrain.train(TINY, run_dir=out)
    return out


def test_evaluate_refuses_a_checkpoint_it_does_not_know(run_dir):
    """``checkpoint="last"`` evaluated ``final`` silently; rltrain-eval's argparse refuses it, so must the API."""
    with pytest.raises(ConfigError) as err:
        rltrain.evaluate(run_dir, checkpoint="last", episodes=1)
    assert str(err.value) == "checkpoint='last' is not one of final, best, latest"


def test_the_apis_errors_name_its_own_arguments(run_dir, tmp_path, capsys):
    from rltrain.cli.evaluate import main

    with pytest.raises(ConfigError) as err:
        rltrain.evaluate(run_dir, episodes=0)
    assert str(err.value) == "episodes=0 must be between 1 and 10,000,000"
    with pytest.raises(ConfigError, match=r"^seed=-1 must be between 0"):
        rltrain.evaluate(run_dir, seed=-1)
    missing = tmp_path / "nope"
    for call in (rltrain.evaluate, rltrain.load_policy):
        with pytest.raises(ConfigError) as err:
            call(missing)
        assert str(err.value) == f"path={missing}: no such file or directory", call
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"^path=\S+empty: no checkpoint found"):
        rltrain.evaluate(tmp_path / "empty")
    # rltrain-eval keeps its flags and its positional path
    assert main([str(missing), "--episodes", "0"]) == 2
    assert capsys.readouterr().err == "rltrain-eval: error: --episodes=0 must be between 1 and 10,000,000\n"
    assert main([str(missing)]) == 2
    assert capsys.readouterr().err == f"rltrain-eval: error: checkpoint={missing}: no such file or directory\n"


def test_reprs_say_what_was_loaded_and_what_was_measured(run_dir):
    policy = rltrain.load_policy(run_dir)
    text = repr(policy)
    assert text.startswith("LoadedPolicy(algo=PPO  env.id=CartPole-v1  observation Box(") and "\n" not in text, text
    assert "action Discrete(2)" in text and re.search(r"  [\d,]+ parameters, checkpoint=\S+final\.pt\)$", text), text
    result = rltrain.evaluate(run_dir, episodes=2)
    text = repr(result)
    assert text.startswith(f"EvalResult(episodes=2, mean={result.mean:.2f}, std={result.std:.2f}, "), text
    assert "deterministic=True" in text and "array" not in text, text


def test_eval_and_the_repr_share_one_line(run_dir):
    out = subprocess.run([sys.executable, "-m", "rltrain.cli.evaluate", str(run_dir), "--episodes", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = [ln for ln in out.stdout.splitlines() if ln.startswith("episodes:")]
    assert result and result[0].endswith("  actions: greedy"), out.stdout
    out = subprocess.run([sys.executable, "-m", "rltrain.cli.evaluate", str(run_dir), "--episodes", "2",
                          "--stochastic"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "  actions: sampled" in out.stdout, out.stdout + out.stderr


def test_check_errors_are_one_line_on_stderr_when_piped(tmp_path):
    """Piped, rich wrapped the job's error at 80 columns on stdout; the model line said [rltrain]."""
    long_dir = tmp_path / ("a_run_dir_whose_name_makes_the_line_longer_than_eighty_columns" * 2)
    res = subprocess.run([sys.executable, "-m", "rltrain.cli.check", "algo=dqn", "algo.n_step=0",
                          f"hydra.run.dir={long_dir}"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and errors[0].endswith("error: algo.n_step=0 must be > 0"), res.stderr
    assert "must be > 0" not in res.stdout, res.stdout
    res = subprocess.run([sys.executable, "-m", "rltrain.cli.check", "algo=dqn", "env=cartpole"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "[rltrain-check] model:" in res.stdout and "[rltrain] " not in res.stdout, res.stdout


LOGGING = """
import logging, logging.config, sys
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

with initialize_config_module("rltrain.conf", version_base="1.3"):
    cfg = compose(config_name="train", return_hydra_config=True)
node = OmegaConf.to_container(cfg.hydra.job_logging, resolve=False)
for handler in node["handlers"].values():
    if "filename" in handler:
        handler["filename"] = sys.argv[1]
logging.config.dictConfig(node)
logging.getLogger("rltrain.algos.dqn").warning("algo.distributional=c51: the mean Q (%.2f) is at the end", 0.95)
logging.getLogger("some_library").warning("its own record")
"""


def test_rltrains_logging_warnings_read_as_its_printed_ones(tmp_path):
    """Hydra's job logging as ``rltrain`` configures it (conf/hydra/job_logging/rltrain.yaml), in a process of
    its own (it is global): a C51 support warning (algos/dqn.py) came out as ``[time][rltrain.algos.dqn][WARNING]
    - ...`` on stdout; another library's record keeps Hydra's format."""
    log = tmp_path / "train.log"
    res = subprocess.run([sys.executable, "-c", LOGGING, str(log)], capture_output=True, text=True, timeout=120)
    assert res.stderr == "rltrain: warning: algo.distributional=c51: the mean Q (0.95) is at the end\n", res.stderr
    assert "rltrain: warning" not in res.stdout and "[some_library][WARNING] - its own record" in res.stdout, res
    logged = log.read_text()
    assert "[rltrain.algos.dqn][WARNING] - algo.distributional=c51" in logged and "its own record" in logged, logged


# a DQN-C51 smoke run whose support ends at +-0.1 while CartPole pays 1 per step: algos/dqn.py warns once, at once
C51_AT_ITS_END = ["algo=dqn", "algo.distributional=c51", "algo.v_min=-0.1", "algo.v_max=0.1", "debug=smoke",
                  "logger=quiet", "logger.progress=off"]


def test_the_cli_says_rltrains_warnings_once_and_hydra_job_logging_disabled_silences_them(tmp_path):
    """The real command: rltrain's own warning is one ``rltrain: warning:`` line on stderr and one line in
    train.log (one file handler on it, not one of rltrain's beside Hydra's). ``hydra/job_logging=disabled``
    silenced Hydra's records and not rltrain's (train.yaml merged rltrain's handlers into every choice): now it
    silences both, on stderr and in train.log (which it does not write)."""
    said = "algo.distributional=c51: the mean Q"
    res = run_cli([*C51_AT_ITS_END, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if said in ln]
    assert len(lines) == 1 and lines[0].startswith(f"rltrain: warning: {said}"), res.stderr
    assert said not in res.stdout, res.stdout[-2000:]
    logged = [ln for ln in (tmp_path / "run" / "train.log").read_text().splitlines() if said in ln]
    assert len(logged) == 1 and f"[rltrain.algos.dqn][WARNING] - {said}" in logged[0], logged

    quiet = run_cli([*C51_AT_ITS_END, f"hydra.run.dir={tmp_path / 'quiet'}", "hydra/job_logging=disabled"],
                    cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert (tmp_path / "quiet" / "summary.json").exists()  # the run itself is the same
    assert said not in quiet.stderr and "rltrain: warning" not in quiet.stderr, quiet.stderr
    assert said not in quiet.stdout, quiet.stdout[-2000:]
    assert not (tmp_path / "quiet" / "train.log").exists()


# one env, one step per update, a target copied every 200 env steps: the run ends (203) before a round follows the
# first trained copy (tests/test_replay_rounds.py), a start-up warning of cli/preflight.py
TARGET_LATE = ["debug=smoke", "logger=quiet", "logger.progress=off", "algo=dqn", "experiment=none", "env.num_envs=1",
               "algo.rollout_len=1", "algo.learning_starts=100", "algo.train_frequency=4", "eval.every_env_steps=0",
               "eval.episodes=1", "checkpoint.every_env_steps=0", "model.hidden_sizes=[16]",
               "algo.target_network_frequency=200", "total_env_steps=203"]
API_RUN = "import sys, rltrain; rltrain.train(sys.argv[2:], run_dir=sys.argv[1])"


def test_the_start_up_warnings_follow_hydra_job_logging_and_the_api_says_them_as_the_cli_does(tmp_path):
    """The target-network warning went to stderr with print(): not in train.log, not silenced by
    ``hydra/job_logging=disabled``. Now it is a record of rltrain's logger, as its other warnings; ``rltrain.train``
    (no job logging, no handler of the caller's) says it as the command does, not as Python's bare message."""
    said = "algo.target_network_frequency=200: the target network first takes trained weights"
    res = run_cli([*TARGET_LATE, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert [ln for ln in res.stderr.splitlines() if said in ln or "warning" in ln] == \
        [ln for ln in res.stderr.splitlines() if ln.startswith(f"rltrain: warning: {said}")], res.stderr
    assert len([ln for ln in res.stderr.splitlines() if said in ln]) == 1 and said not in res.stdout, res.stderr
    logged = [ln for ln in (tmp_path / "run" / "train.log").read_text().splitlines() if said in ln]
    assert len(logged) == 1 and f"[rltrain.cli.preflight][WARNING] - {said}" in logged[0], logged

    quiet = run_cli([*TARGET_LATE, f"hydra.run.dir={tmp_path / 'quiet'}", "hydra/job_logging=disabled"], cwd=tmp_path)
    assert quiet.returncode == 0 and (tmp_path / "quiet" / "summary.json").exists(), quiet.stderr[-2000:]
    assert said not in quiet.stderr + quiet.stdout and not (tmp_path / "quiet" / "train.log").exists(), quiet.stderr

    api = subprocess.run([sys.executable, "-c", API_RUN, str(tmp_path / "api"), *TARGET_LATE], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert api.returncode == 0, api.stderr[-2000:]
    assert [ln for ln in api.stderr.splitlines() if said in ln] == [
        ln for ln in api.stderr.splitlines() if ln.startswith(f"rltrain: warning: {said}")] != [], api.stderr
