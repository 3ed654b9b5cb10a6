"""Multi-agent games as users meet them: an env whose ``state`` is not a global state (rock-paper-scissors), a
zero-sum or constant-sum game trained without self-play (its headline must not be the constant of a mean over
agents), a policy mapping beside self-play, agents whose actions are translated at the env boundary (a
Discrete start, a float64 Box), PettingZoo's per-move warnings, and the order the agents are shown in.

Real envs from PettingZoo's classic games and the small envs of ``tests/helpers/agent_envs.py``.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv

from rltrain.algos.groups import policy_groups
from rltrain.envs.make import EnvFactory, probe_env
from rltrain.envs.multiagent import AgentEnv, agents_spec
from rltrain.errors import ConfigError
from rltrain.trainers.matches import constant_sum
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
    # the AEC game: 4 updates of up to 64 turns, a turn-based run ends after them (at 256 turns or fewer); the
    # parallel one: 8 joint steps of 32
    assert summary["status"] == "completed" and summary["updates"] == (8 if RPS_PARALLEL in args[0] else 4)
    assert 0.9 * 256 <= summary["total_env_steps"] <= 1.05 * 256  # self-play: the other seat may move once more
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
    assert constant_sum([{"a": 1.0, "b": -1.0}, {"a": 0.0, "b": 0.0}]) == 0.0
    assert constant_sum([{"a": 1.0, "b": -1.0}, {"a": 1.0, "b": 1.0}]) is None  # one cooperative episode says no
    assert constant_sum([{"a": 0.0, "b": 0.0}]) is None  # draws only: nothing to tell
    assert constant_sum([{"a": 0.1, "b": 0.2, "c": -0.3}]) == 0.0  # three players, float rounding


def test_a_constant_sum_is_read_from_enough_episodes_whose_split_varies():
    win, lose, draw = {"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 1.0}, {"a": 0.5, "b": 0.5}
    assert constant_sum([win, lose, win, draw]) == 1.0  # win 1 / loss 0 / draw 0.5 each
    assert constant_sum([win, {"a": 0.1 + 0.2, "b": 0.7}, lose, win]) == 1.0  # float rounding
    assert constant_sum([win, lose, {"a": 1.0, "b": 1.0}, win]) is None  # one episode's sum differs
    assert constant_sum([win] * 8) is None  # the same split every time: a fixed payout, as a cooperative game's
    assert constant_sum([{"a": 1.0, "b": 1.0}] * 8) is None  # everyone paid the same every episode
    assert constant_sum([win, lose]) is None  # too few episodes to claim a non-zero constant
    assert constant_sum([]) is None


class WinLoss(ParallelEnv):
    """Two players pick 0 or 1 at once, one round per episode: both 0 is a draw (0.5 each); otherwise ``first``
    wins when they pick the same and ``second`` when they differ (1 to the winner, 0 to the loser). Every
    episode's returns sum to 1, never to 0."""

    metadata = {"name": "win_loss_v0"}

    def __init__(self):
        self.possible_agents = ["first", "second"]

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (1,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return {a: np.ones(1, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        a, b = int(actions["first"]), int(actions["second"])
        first = 0.5 if a == b == 0 else float(a == b)
        obs = {x: np.ones(1, np.float32) for x in self.agents}
        done = dict.fromkeys(self.agents, True)
        self.agents = []
        return (obs, {"first": first, "second": 1.0 - first}, done, dict.fromkeys(done, False),
                {x: {} for x in done})


def test_a_constant_sum_game_is_evaluated_against_random_moves(tmp_path, monkeypatch, capsys):
    """A game paying 1 to the winner and 0 to the loser (0.5 each for a draw) has a mean over agents of 0.5
    whatever they learn: it is evaluated as a zero-sum game is, against random moves, and the constant is said."""
    summary = _run([f"env.id={__name__}:WinLoss", "algo=ippo", "algo.rollout_len=32"], tmp_path / "cs", monkeypatch)
    assert summary["constant_sum"] == 1.0 and "zero_sum" not in summary
    assert summary["train_return_last100"] == pytest.approx(0.5)
    rates = summary["eval_vs_random"]
    # each agent's return against random moves: 1 for a win, 0.5 for a draw, 0 for a loss (beyond 1 / 2, at it,
    # below it: the fair share of the constant)
    assert summary["final_eval_return"] == pytest.approx(rates["win"] + 0.5 * rates["draw"])
    assert sum(summary["eval_head_to_head_per_agent"].values()) == pytest.approx(1.0)
    notes = [ln for ln in capsys.readouterr().out.splitlines() if "is a constant-sum game" in ln]
    assert len(notes) == 1 and "summed to 1 in every episode" in notes[0] and "mean is 0.5" in notes[0], notes
    from rltrain.cli.evaluate import main as evaluate_main

    assert evaluate_main([str(tmp_path / "cs"), "--episodes", "4", "--allow-import"]) == 0
    out = capsys.readouterr().out
    assert "mean return over agents: 0.50" in out and "(constant-sum 1: 0.50 whatever is learnt)" in out, out
    assert "vs random: episodes: 4" in out, out


def test_a_zero_sum_game_without_self_play_is_evaluated_against_random_moves(tmp_path, monkeypatch, capsys):
    """The mean over a zero-sum game's agents is 0 whatever they learn (a sweep on it would optimise a constant):
    final_eval_return is each agent's policy against random legal moves, said once at the end."""
    summary = _run([f"env.id={TURNS}", "algo=ippo", "algo.rollout_len=32"], tmp_path / "zs", monkeypatch)
    assert summary["zero_sum"] is True and summary["constant_sum"] == 0.0 and summary["train_return_last100"] == 0
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
    assert "zero_sum" not in summary and "constant_sum" not in summary and "eval_vs_random" not in summary
    assert summary["final_eval_return"] == pytest.approx(np.mean(list(summary["final_eval_return_per_agent"].values())))
    assert "is a zero-sum game" not in capsys.readouterr().out


@pytest.mark.parametrize("args", [[], ["algo.self_play=true"]], ids=["zero_sum", "self_play"])
def test_the_api_evaluation_of_a_zero_sum_game_repeats_the_runs_headline_against_random_moves(tmp_path, monkeypatch,
                                                                                               args):
    """``rltrain.evaluate`` repeats the run's final evaluation: in a zero-sum game (self-play or not) that is the
    learner against random legal moves, not the mean over agents, which is 0 whatever was learnt."""
    import rltrain

    summary = _run([f"env.id={TURNS}", "algo=ippo", "algo.rollout_len=32", *args], tmp_path / "run", monkeypatch)
    result = rltrain.evaluate(tmp_path / "run", episodes=4, allow_import=True)  # TINY's eval.episodes
    assert result.returns.shape == (4, 2) and result.returns.sum(1) == pytest.approx(np.zeros(4))
    assert result.constant_sum == 0.0 and result.vs_random is not None and result.vs_random.shape == (4,)
    assert result.mean == pytest.approx(summary["final_eval_return"])
    assert result.std == pytest.approx(summary["final_eval_return_std"])
    assert result.outcomes == summary["eval_vs_random"]
    assert "vs random legal moves (constant-sum 0)" in repr(result)


# -- 4. agents acting in their own spaces: a Discrete start, float64 Box actions ------------------------------
PICKY = "tests.helpers.agent_envs:picky"  # chooser: Discrete(3, start=-1); mover: a float64 Box; strict steps


@pytest.mark.parametrize("masked", [False, True])
def test_agents_get_actions_in_their_own_spaces_in_training_evaluation_the_api_and_the_export(tmp_path, monkeypatch,
                                                                                             masked):
    """The env raises on an index handed on unshifted, a masked value, or a float32 action: training, evaluation
    (random legal moves included), rltrain-eval, load_policy and the exported files all step it with its own
    values; the mask stays indexed 0..n-1 (index 2, the value 1, is the masked one)."""
    import rltrain
    from rltrain.cli.evaluate import main as evaluate_main
    from rltrain.cli.export import export_files
    from tests.helpers.agent_envs import picky

    extra = ["+env.kwargs.masked=true"] if masked else []
    summary = _run([f"env.id={PICKY}", "algo=ippo", *extra], tmp_path / "run", monkeypatch)
    assert summary["status"] == "completed", summary
    assert evaluate_main([str(tmp_path / "run"), "--episodes", "4", "--allow-import"]) == 0

    spec = probe_env(EnvFactory(id=PICKY, kwargs={"masked": masked}, num_envs=1), "auto").spec
    chooser, mover = spec.spec_of("chooser"), spec.spec_of("mover")
    assert (chooser.n_actions, chooser.action_start, chooser.masked) == (3, (-1,), masked)
    assert mover.env_action_dtype == "float64" and mover.action_low == (-0.1, -0.1)
    policies = rltrain.load_policy(tmp_path / "run")
    assert policies["chooser"].spec.action_start == (-1,) and policies["mover"].spec.env_action_dtype == "float64"
    env = picky(masked=masked)
    obs, _ = env.reset(seed=0)
    for _ in range(6):
        actions = {a: policies[a].act(obs[a], deterministic=False)[0] for a in env.agents}
        assert actions["mover"].dtype == np.float64
        obs, *_ = env.step(actions)  # raises on anything outside the agent's own space (and dtype)

    files = export_files(tmp_path / "run", fmt="export", out=tmp_path / "export" / "pi.pt2")
    env.reset(seed=1)
    observations = {a: [env._observe()[a] for _ in range(16)] for a in env.possible_agents}
    for agent, path in zip(env.possible_agents, files, strict=True):
        assert path.name == f"pi_{agent}.pt2"
        batch = {k: np.stack([o[k] for o in observations[agent]]) for k in observations[agent][0]} if masked and \
            agent == "chooser" else np.stack(observations[agent])  # float64, as the env gives them
        names = [i["name"] for i in json.loads(path.with_suffix(".json").read_text())["inputs"]]
        inputs = [torch.from_numpy(batch[n.removeprefix("obs.")] if isinstance(batch, dict) else batch) for n in names]
        got = torch.export.load(path).module()(*inputs).numpy()
        want, _ = policies[agent].act(batch)
        assert got.dtype == want.dtype and np.allclose(got, want, atol=1e-6), agent
        assert all(env.action_space(agent).contains(a) for a in got), (agent, got)


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


def test_an_agents_shaped_box_is_flat_for_its_policy_and_shaped_for_the_env(tmp_path, monkeypatch):
    """A PettingZoo agent with a (2, 2) float64 Box action (``mover``; its step raises on any other shape, dtype
    or value): its policy acts on the 4 values, and training, evaluation, load_policy and the exported file hand
    the env its own (2, 2) action ([B, 2, 2] for a batch)."""
    import rltrain
    from rltrain.cli.evaluate import main as evaluate_main
    from rltrain.cli.export import export_files
    from tests.helpers.shaped_envs import matrix_agents

    summary = _run(["env.id=tests.helpers.shaped_envs:matrix_agents", "algo=ippo"], tmp_path / "run", monkeypatch)
    assert summary["status"] == "completed", summary
    assert evaluate_main([str(tmp_path / "run"), "--episodes", "2", "--allow-import"]) == 0
    policies = rltrain.load_policy(tmp_path / "run")
    mover = policies["mover"]
    assert (mover.spec.action_shape, mover.spec.env_action_shape) == ((4,), (2, 2))
    env = matrix_agents()
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        actions = {a: policies[a].act(obs[a], deterministic=False)[0] for a in env.agents}
        assert actions["mover"].shape == (2, 2) and actions["mover"].dtype == np.float64
        obs, *_ = env.step(actions)
    files = export_files(tmp_path / "run", fmt="export", out=tmp_path / "export" / "pi.pt2")
    batch = np.stack([env._observe()["mover"] for _ in range(5)])
    assert files[1].name == "pi_mover.pt2"
    got = torch.export.load(files[1]).module()(torch.from_numpy(batch)).numpy()
    want, _ = mover.act(batch)
    assert got.shape == want.shape == (5, 2, 2) and np.allclose(got, want, atol=1e-6)
    assert json.loads(files[1].with_suffix(".json").read_text())["action"]["shape"] == [2, 2]
