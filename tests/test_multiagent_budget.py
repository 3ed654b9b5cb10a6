"""What a multi-agent run says of itself against what it does: a turn-based game's budget ends where the start
line and ``rltrain-check`` say, an agent its env never listed is one line, the self-play training return and its
per-seat figures describe the same episodes, and ``rltrain-eval`` counts the policy's own parameters.

Real PettingZoo games (tic-tac-toe, rock-paper-scissors) and ``tests/helpers/agent_envs.py``'s ``stowaway``.
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch

from tests.conftest import REPO, compose_cfg

TTT = "pettingzoo.classic.tictactoe_v3:env"
RPS = "pettingzoo.classic.rps_v2:parallel_env"
QUIET = ["debug=smoke", "env.num_envs=2", "algo=ippo", "algo.update_epochs=1", "eval.episodes=2",
         "eval.every_env_steps=0", "checkpoint.every_env_steps=0"]


def test_a_turn_based_run_ends_after_the_updates_its_start_line_and_rltrain_check_announce(tmp_path, capsys):
    """Tic-tac-toe without self-play: the first mover's slots fill first, so an update takes fewer turns than
    its 2 x 32 rows per env (about 117 of 128). Counting turns alone ran a third update (to about 350 of 256);
    the run ends after the 2 updates rltrain-check announces, at 256 turns or fewer."""
    from rltrain.cli import build, check

    args = [*QUIET, f"env.id={TTT}", "algo.rollout_len=32", "total_env_steps=256", "logger.progress=plain",
            "logger.progress_interval_s=0"]
    trainer = build.build_trainer(build.prepare(compose_cfg(args)), tmp_path / "c", check_only=True)
    rows = dict(check.batch_rows(trainer.settings.config, trainer))
    assert rows["updates"].startswith("256 total_env_steps / 128 = 2, whole: the run ends after 2 updates, at about "
                                      "256 env steps or fewer"), rows["updates"]
    summary = build.run(compose_cfg(args), tmp_path / "run")
    assert summary["updates"] == 2 and summary["total_env_steps"] <= 256, summary
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[training]")]
    # the display never claims the total at a figure the run then passes
    assert all(int(x.split()[1].split("/")[0]) <= summary["total_env_steps"] for x in lines), lines


def test_an_agent_missing_from_possible_agents_is_one_line_naming_it(cli):
    res = cli(*QUIET, "env.id=tests.helpers.agent_envs:stowaway", "total_env_steps=256", "logger.progress=off",
              timeout=120, env={"PYTHONPATH": str(REPO)})
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = [x for x in res.stderr.splitlines() if x.strip() and "arn" not in x]
    assert len(lines) == 1 and lines[0].startswith("rltrain: error: "), res.stderr
    assert "agent 'c' of env.id=tests.helpers.agent_envs:stowaway is not in its possible_agents ['a', 'b']" in \
        lines[0] and "KeyError" not in lines[0], lines[0]


@pytest.fixture(scope="module")
def self_play_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("rps") / "run"
    args = [*QUIET, f"env.id={RPS}", "algo.self_play=true", "algo.rollout_len=64", "+env.kwargs.max_cycles=5",
            "total_env_steps=512", "logger.progress=off", "log.every_env_steps=128"]
    from rltrain.cli.build import run

    run(compose_cfg(args), run_dir)
    return run_dir


def test_self_play_return_and_its_seats_are_the_same_episodes(self_play_run):
    """The headline is the learner's last 20 episodes; each seat's figure is the learner's return in that seat
    over those same episodes (it used to be each seat's own last 20: 40 episodes, and figures that did not agree)."""
    with open(self_play_run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    state = torch.load(self_play_run / "checkpoints" / "final.pt", weights_only=False)["collector"]
    recent, seats = state["recent_returns"], state["agent_returns"]
    assert set(seats) == {"player_0", "player_1"}
    # one entry per episode in every seat: the learner's return where it sat, NaN in the other
    assert all(len(s) == len(recent) for s in seats.values()), (len(recent), {a: len(s) for a, s in seats.items()})
    for k, ret in enumerate(recent):
        played = [s[k] for s in seats.values() if not math.isnan(s[k])]
        assert played == [ret]
    last = rows[-1]
    assert float(last["rollout/episode_return"]) == pytest.approx(np.mean(recent[-20:]))
    for agent, returns in seats.items():
        assert float(last[f"rollout/episode_return/{agent}"]) == pytest.approx(np.nanmean(returns[-20:]))
    for row in rows:  # a mean over the same episodes lies between its seats' figures
        per_seat = [float(row[f"rollout/episode_return/{a}"]) for a in seats]
        assert min(per_seat) - 1e-9 <= float(row["rollout/episode_return"]) <= max(per_seat) + 1e-9, row


def test_rltrain_eval_counts_the_self_play_policys_parameters_not_its_pool(self_play_run, capsys):
    from rltrain.cli.evaluate import main

    """The figure training printed (model.txt's total), not that plus the pool's 10 copies of it."""
    trained = (self_play_run / "model.txt").read_text().split("total: ", 1)[1].split(" parameters")[0]
    assert main([str(self_play_run)]) == 0
    out = capsys.readouterr().out
    assert f" {trained} parameters (and a self-play pool of 10 past versions)" in out, out
    assert json.loads((self_play_run / "summary.json").read_text())["status"] == "completed"
