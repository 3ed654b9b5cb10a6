"""The tools and the Python API say what they did in their own words: the API's errors name its arguments (not
the command lines' flags), a choice it does not know is refused (never read as ``final``), its objects show what
they hold, ``rltrain-check``'s errors are one line on stderr whatever the terminal, ``rltrain-eval`` names the
actions it took, and rltrain's own ``logging`` warnings read as its printed ones."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import rltrain
from rltrain.errors import ConfigError

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
    """Hydra's job logging as ``rltrain`` configures it (conf/train.yaml over Hydra's default), in a process of
    its own (it is global): a C51 support warning (algos/dqn.py) came out as ``[time][rltrain.algos.dqn][WARNING]
    - ...`` on stdout; another library's record keeps Hydra's format."""
    log = tmp_path / "train.log"
    res = subprocess.run([sys.executable, "-c", LOGGING, str(log)], capture_output=True, text=True, timeout=120)
    assert res.stderr == "rltrain: warning: algo.distributional=c51: the mean Q (0.95) is at the end\n", res.stderr
    assert "rltrain: warning" not in res.stdout and "[some_library][WARNING] - its own record" in res.stdout, res
    logged = log.read_text()
    assert "[rltrain.algos.dqn][WARNING] - algo.distributional=c51" in logged and "its own record" in logged, logged
