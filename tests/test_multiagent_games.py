"""Multi-agent games as users meet them: an env whose ``state`` is not a global state (rock-paper-scissors), a
zero-sum game trained without self-play (its headline must not be the constant 0 of a mean over agents), a
policy mapping beside self-play, PettingZoo's per-move warnings, and the order the agents are shown in.

Real envs from PettingZoo's classic games and the small envs of ``tests/helpers/agent_envs.py``.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from rltrain.algos.groups import policy_groups
from rltrain.envs.make import EnvFactory, probe_env
from rltrain.envs.multiagent import AgentEnv, agents_spec
from rltrain.errors import ConfigError
from rltrain.trainers.matches import zero_sum
from tests.conftest import REPO, compose_cfg

torch.set_num_threads(1)
RPS = "pettingzoo.classic.rps_v2:env"
RPS_PARALLEL = "pettingzoo.classic.rps_v2:parallel_env"
C4 = "pettingzoo.classic.connect_four_v3:env"
TURNS = "tests.helpers.agent_envs:turns"
# rock-paper-scissors: 15 rounds, 30 turns of an AEC game; one update of 16 rows x 2 envs is 64 turns
TINY = ["debug=smoke", "logger.progress=off", "env.num_envs=2", "eval.episodes=4", "algo.rollout_len=16",
        "algo.update_epochs=1", "total_env_steps=256", "eval.every_env_steps=128", "checkpoint.every_env_steps=0"]


def _run(args: list[str], run_dir, monkeypatch) -> dict:
    from rltrain.cli.build import run

    monkeypatch.syspath_prepend(str(REPO))
    return run(compose_cfg([*TINY, *args]), run_dir)


# -- 1. an env's state() that is no global state ------------------------------------------------------------
def test_rock_paper_scissors_state_dict_is_no_global_state_and_its_indices_join_one_hot():
    """rps's raw env keeps a dict named ``state`` that shadows PettingZoo's ``state()`` (its wrappers' call of
    it raises TypeError): it has no global state, and its Discrete observations join as one-hot vectors."""
    from pettingzoo.classic import rps_v2

    specs = []
    for make in (rps_v2.parallel_env, rps_v2.env):
        env = make()
        specs.append(agents_spec(env, RPS))
        env.close()
    assert [s.api for s in specs] == ["parallel", "aec"]
    assert all(s.state is None and s.joined.shape == (8,) for s in specs)  # two Discrete(4) observations, one-hot
    env = AgentEnv(rps_v2.env(), specs[1])
    env.reset(seed=0)
    env.step({env.acting[0]: 2})
    env.step({env.acting[0]: 0})  # both moved: each observes the other's move
    joined = env.state("joined")
    assert joined.dtype == np.float32 and joined.tolist() == [1, 0, 0, 0, 0, 0, 1, 0]
    env.close()


@pytest.mark.parametrize("state", [{"player": 1}, lambda: 1 / 0, lambda: "text", lambda: np.zeros(0)],
                         ids=["a dict attribute", "raises", "not numbers", "empty"])
def test_a_state_that_is_not_a_method_raises_or_is_not_numbers_is_no_global_state(state):
    from tests.helpers.agent_envs import uneven

    env = uneven()
    env.state = state  # the instance's own attribute, as rps's raw env has one
    spec = agents_spec(env, "tests.helpers.agent_envs:uneven")
    assert spec.state is None and spec.joined is not None


@pytest.mark.parametrize("args", [[f"env.id={RPS}", "algo=ippo"], [f"env.id={RPS_PARALLEL}", "algo=mappo"],
                                  [f"env.id={RPS}", "algo=ippo", "algo.self_play=true"],
                                  [f"env.id={RPS_PARALLEL}", "algo=mappo", "algo.self_play=true"]],
                         ids=["ippo", "mappo", "ippo-self-play", "mappo-self-play"])
def test_rock_paper_scissors_trains_with_ippo_mappo_and_self_play(tmp_path, monkeypatch, args):
    from rich.console import Console

    from rltrain.cli import check

    monkeypatch.chdir(tmp_path)  # where rltrain-check tries its run directory's parent
    assert check.check([*TINY, *args], Console(record=True, width=200)) == 0  # rltrain-check too
    summary = _run(args, tmp_path, monkeypatch)
    assert summary["status"] == "completed" and summary["total_env_steps"] >= 256
    assert set(summary["eval_vs_random"]) == {"win", "draw", "loss"}  # self-play, or a zero-sum game without


def test_global_state_env_is_refused_where_state_is_no_global_state(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"^algo.global_state=env: env.id=pettingzoo.classic.rps_v2:parallel_env "
                                          r"has no usable state\(\)") as err:
        _run([f"env.id={RPS_PARALLEL}", "algo=mappo", "algo.global_state=env"], tmp_path, monkeypatch)
    assert "\n" not in str(err.value)


# -- 2. a policy mapping beside self-play -------------------------------------------------------------------
@pytest.mark.parametrize("policies", ["per_agent", "shared", "{player_0:a,player_1:b}"])
def test_self_play_refuses_a_policy_mapping_in_one_line(tmp_path, monkeypatch, policies):
    with pytest.raises(ConfigError) as err:
        _run([f"env.id={C4}", "algo=ippo", f"algo.policies={policies}", "algo.self_play=true"], tmp_path,
             monkeypatch)
    text = str(err.value)
    assert text.startswith(f"algo.policies={policies} with algo.self_play=true: self-play trains one policy that "
                           "plays every seat") and "\n" not in text
    assert not (tmp_path / "checkpoints").exists()


def test_self_play_keeps_its_one_policy_with_the_default_mapping():
    spec = probe_env(EnvFactory(id=C4, num_envs=2), "auto").factory.spec()
    groups = policy_groups(spec, policies="auto", agent_id=True, state=None, self_play=True)
    assert [(g.name, g.agents) for g in groups] == [("main", ("player_0", "player_1"))]


# -- 3. a zero-sum game without self-play -------------------------------------------------------------------
def test_zero_sum_is_read_from_the_episodes():
    assert zero_sum([{"a": 1.0, "b": -1.0}, {"a": 0.0, "b": 0.0}]) is True
    assert zero_sum([{"a": 1.0, "b": -1.0}, {"a": 1.0, "b": 1.0}]) is False  # one cooperative episode says no
    assert zero_sum([{"a": 0.0, "b": 0.0}]) is None  # draws only: nothing to tell
    assert zero_sum([{"a": 0.1, "b": 0.2, "c": -0.3}]) is True  # three players, float rounding


def test_a_zero_sum_game_without_self_play_is_evaluated_against_random_moves(tmp_path, monkeypatch, capsys):
    """The mean over a zero-sum game's agents is 0 whatever they learn (a sweep on it would optimise a constant):
    final_eval_return is each agent's policy against random legal moves, said once at the end."""
    summary = _run([f"env.id={TURNS}", "algo=ippo", "algo.rollout_len=32"], tmp_path / "zs", monkeypatch)
    assert summary["zero_sum"] is True and summary["train_return_last100"] == 0
    rates = summary["eval_vs_random"]
    # the game pays +1 / -1 and has no draw: the headline is the win rate less the loss rate against random moves
    assert summary["final_eval_return"] == pytest.approx(rates["win"] - rates["loss"])
    assert set(summary["final_eval_return_per_agent"]) == set(summary["eval_head_to_head_per_agent"]) == {"p0", "p1"}
    assert sum(summary["eval_head_to_head_per_agent"].values()) == pytest.approx(0)
    header = (tmp_path / "zs" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"eval/head_to_head/p0", "eval/win_vs_random", "eval/return_mean/p1"} <= set(header)
    notes = [ln for ln in capsys.readouterr().out.splitlines() if "is a zero-sum game" in ln]
    assert len(notes) == 1 and "algo.self_play=true" in notes[0]
    from rltrain.cli.evaluate import main as evaluate_main  # rltrain-eval says the same of the run

    assert evaluate_main([str(tmp_path / "zs"), "--episodes", "4", "--allow-import"]) == 0
    out = capsys.readouterr().out
    assert "mean return over agents: 0.00" in out and "(zero-sum: 0 whatever is learnt)" in out, out
    assert "vs random: episodes: 4" in out and "win " in out, out
    # a cooperative game: the mean over its agents, as before, and no note
    summary = _run([f"env.id={TURNS}", "+env.kwargs.zero_sum=false", "algo=ippo", "algo.rollout_len=32"],
                   tmp_path / "coop", monkeypatch)
    assert "zero_sum" not in summary and "eval_vs_random" not in summary
    assert summary["final_eval_return"] == pytest.approx(np.mean(list(summary["final_eval_return_per_agent"].values())))
    assert "is a zero-sum game" not in capsys.readouterr().out


# -- 5. PettingZoo's per-move warnings -----------------------------------------------------------------------
def _illegal_games(n: int) -> None:
    """``n`` games of connect four, masks off, each ended by the 7th move into a full column 0."""
    factory = probe_env(EnvFactory(id=C4, num_envs=1), "off").factory
    venv = factory.vector([0], num_envs=1)
    venv.reset()
    for _ in range(n):
        while not venv.envs[0].over:
            venv.step(0, {venv.envs[0].acting[0]: 0})
        venv.reset(0)
    venv.close()


def test_an_illegal_move_warning_is_shown_once_and_counted_at_the_end(caplog):
    caplog.set_level(logging.WARNING)
    _illegal_games(5)
    illegal = [r for r in caplog.records if r.name == "pettingzoo.utils.env_logger"]
    assert len(illegal) == 1 and "Illegal move made" in illegal[0].getMessage()
    counted = [r.getMessage() for r in caplog.records if r.name == "rltrain.envs"]
    assert counted == ["PettingZoo's warning '[WARNING]: Illegal move made, game terminating with current player "
                       "losing.' came 5 times (shown once)"]
    caplog.clear()
    _illegal_games(2)  # the next run says it once again
    assert sum(r.name == "pettingzoo.utils.env_logger" for r in caplog.records) == 1
    assert [r.getMessage() for r in caplog.records if r.name == "rltrain.envs"][0].endswith("came 2 times (shown once)")


# -- 6. the agents' order ------------------------------------------------------------------------------------
def test_merged_rollouts_keep_the_agents_in_possible_agents_order():
    """What subprocess_actors' learner shows per agent: its actors' rollouts merged, the agents in the env's
    order (not a set's)."""
    from rltrain.data.agents import MultiRollout
    from rltrain.trainers.actors.rollouts import merge_rollouts

    agents = [f"agent_{k}" for k in reversed(range(24))]  # neither sorted nor a set's order
    rollouts = [MultiRollout({}, 8, agent_returns={a: [float(k)] for a in agents}) for k in range(2)]
    merged = merge_rollouts(rollouts)
    assert list(merged.agent_returns) == agents and merged.agent_returns[agents[0]] == [0.0, 1.0]
