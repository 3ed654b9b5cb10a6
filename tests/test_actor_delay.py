"""A delayed actor (TD3's ``policy_delay``, SAC's ``policy_frequency``): the rows log its statistics from the
gradient steps that computed them, never a placeholder (algos/off_policy.py ``OffPolicy._mean_stats``), and a run
too short for its first step is refused at start in one line (cli/replay_budget.py ``check_actor_delay``)."""

from __future__ import annotations

import pytest
import torch
from rich.console import Console

from rltrain.algos.sac import SAC
from rltrain.algos.td3 import TD3
from rltrain.cli import build, check
from rltrain.cli.presets import resolve_experiment
from rltrain.errors import ConfigError
from rltrain.run.metrics import read_metrics
from tests.conftest import compose_cfg
from tests.test_settings_ranges import SMOKE

# one env, one step per learn(); rows at an odd interval, so that they fall after learn() calls with and without
# an actor step
RUN = [*SMOKE, "env=pendulum", "experiment=none", "env.num_envs=1", "algo.rollout_len=1", "algo.learning_starts=50",
       "algo.batch_size=32", "model.hidden_sizes=[16]", "log.every_env_steps=51", "eval.every_env_steps=0",
       "eval.episodes=1", "checkpoint.every_env_steps=0", "total_env_steps=400"]
DELAYED = {"td3": (TD3, "policy_delay", ("loss/actor",)),
           "sac": (SAC, "policy_frequency", ("loss/actor", "loss/alpha", "train/entropy"))}


@pytest.mark.parametrize("algo", DELAYED)
@pytest.mark.parametrize("per_round", [1, 2], ids=["one_step_per_round", "two_steps_per_round"])
def test_each_row_holds_the_mean_over_the_last_actor_steps_never_a_placeholder(tmp_path, monkeypatch, algo,
                                                                             per_round):
    """With the actor stepping every 2nd gradient step, a learn() of one gradient step without it logged 0.0, and
    one of two steps the actor loss halved (averaged with the placeholder): each delayed column must hold the mean
    over the actor steps of the last learn() that took one, and stay empty before the first."""
    cls, key, names = DELAYED[algo]
    columns = [cls.stat_names.index(n) for n in names]
    actor_steps: list[tuple[int, list[float]]] = []  # (the env step of the learn() call, its delayed stats)
    real = cls.update

    def update(self, batch):
        stats = real(self, batch)
        if self.gradient_steps_taken % 2 == 0:  # the actor's step (policy delay 2; the counter includes this step)
            actor_steps.append((self.env_steps, [float(stats[k]) for k in columns]))
        return stats

    monkeypatch.setattr(cls, "update", update)
    rounds = [f"algo.train_frequency={per_round}", f"algo.gradient_steps={per_round}"]
    summary = build.run(compose_cfg([*RUN, f"algo={algo}", f"algo.{key}=2", *rounds]), tmp_path / "run")
    assert summary["status"] == "completed"
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    checked = 0
    for row in rows:
        step = int(row["env_steps"])
        calls = [at for at, _ in actor_steps if at <= step]
        if not calls:
            assert all(row.get(n, "") == "" for n in names), row
            continue
        last = [stats for at, stats in actor_steps if at == max(calls)]
        for k, name in enumerate(names):
            expected = sum(s[k] for s in last) / len(last)
            assert float(row[name]) == pytest.approx(expected, rel=1e-6, abs=1e-9), (step, name, row[name], last)
        assert float(row["loss/actor"]) != 0.0
        checked += 1
    assert checked >= 5 and len(actor_steps) > 100, (checked, len(actor_steps))


def _actor_trained(run_dir) -> tuple[int, bool]:
    state = torch.load(run_dir / "checkpoints" / "final.pt", weights_only=False)["algo"]
    return state["counters"]["gradient_steps"], bool(state["actor_optimizer"]["state"])


# the batch (32 + the one env's newest row) is in at env step 33, the warm-up ends at 50: one gradient step per
# env step from 50 to the end, 150 of them in a 200-step run
NEVER = {
    "td3": ("algo.policy_delay=151: the run takes 150 gradient steps (algo.gradient_steps=1 per "
            "algo.train_frequency=1 env steps owed from env step 50 to 200) and the actor steps once per 151, first "
            "at gradient step 151, so it would never be trained; set algo.policy_delay <= 150 or "
            "total_env_steps >= 201"),
    "sac": ("algo.policy_frequency=151: the run takes 150 gradient steps (algo.gradient_steps=1 per "
            "algo.train_frequency=1 env steps owed from env step 50 to 200) and the actor steps once per 151, "
            "first at gradient step 151, so it would never be trained; set algo.policy_frequency <= 150 or "
            "total_env_steps >= 201"),
}


@pytest.mark.parametrize("algo", NEVER)
def test_an_actor_delay_past_the_runs_gradient_steps_is_refused_and_the_values_named_train_it(tmp_path, algo):
    _, key, _ = DELAYED[algo]
    short = [*RUN, f"algo={algo}", "total_env_steps=200"]
    with pytest.raises(ConfigError) as err:
        build.run(compose_cfg([*short, f"algo.{key}=151"]), tmp_path / "never")
    assert str(err.value) == NEVER[algo]
    assert not (tmp_path / "never" / "summary.json").exists()
    console = Console(record=True, width=600)
    assert check.check(resolve_experiment([*short, f"algo.{key}=151"])[0], console) == 2
    assert NEVER[algo] in console.export_text().replace("\n", "")
    for name, works in (("delay", [f"algo.{key}=150"]), ("budget", [f"algo.{key}=151", "total_env_steps=201"])):
        build.run(compose_cfg([*short, *works]), tmp_path / name)
        steps, trained = _actor_trained(tmp_path / name)
        assert trained and steps == (150 if name == "delay" else 151), (name, steps)


def test_trainer_parallel_counts_each_agents_share(tmp_path):
    over = [*RUN, "algo=td3", "trainer=parallel", "trainer.num_agents=2", "total_env_steps=400",
            "algo.policy_delay=151"]  # the whole budget would take 350 gradient steps; each agent's 150
    with pytest.raises(ConfigError, match=r"^trainer=parallel: agent 0 of 2 gets 200 of total_env_steps=400: "
                                          r"algo.policy_delay=151: the run takes 150 gradient steps"):
        build.run(compose_cfg(over), tmp_path / "run")


def test_a_fixed_alpha_logs_no_alpha_loss_and_its_value(tmp_path):
    """``algo.autotune=false`` has no alpha loss: the rows logged a constant 0 as ``loss/alpha`` (read as a
    converged loss); they must leave the column out and log the fixed alpha as ``train/alpha``."""
    build.run(compose_cfg([*RUN, "algo=sac", "algo.autotune=false", "algo.alpha=0.3", "total_env_steps=200"]),
              tmp_path / "run")
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.csv") if r.get("loss/q", "") != ""]
    assert rows and all("loss/alpha" not in r or r["loss/alpha"] == "" for r in rows), rows[-1]
    assert all(float(r["train/alpha"]) == pytest.approx(0.3) for r in rows)
    assert all(float(r["loss/actor"]) != 0.0 for r in rows)
