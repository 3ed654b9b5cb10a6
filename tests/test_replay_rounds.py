"""When a replay learner's first round of updates, and its first target update after a gradient step, fall due
(algos/off_policy.py ``UpdateSchedule.first_round``, ``first_trained_sync``), against a driven DQN; and what
``rltrain`` and ``rltrain-check`` say of a budget that fills a batch but ends before that round (refused in one
line: no gradient step would ever be taken) or before a round follows the target's first trained update (a
warning: every TD target would come from the initial network)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from rich.console import Console

from rltrain.algos.dqn import DQN, DQNSettings
from rltrain.algos.off_policy import UpdateSchedule, first_trained_sync
from rltrain.cli import build, check
from rltrain.cli.presets import resolve_experiment
from rltrain.errors import ConfigError
from rltrain.run.metrics import read_metrics
from tests.conftest import compose_cfg, run_cli
from tests.test_faults import _pythonpath
from tests.test_off_policy import CARTPOLE, CPU, SMALL, stream
from tests.test_settings_ranges import GOALS, SMOKE


def test_the_first_round_the_last_round_and_the_first_trained_sync_match_a_driven_dqn():
    """Never-ending streams (each stream's newest row waits for its successor, the case the lines count on), over
    envs, rollout lengths, warm-ups, frequencies and batches drawn at random: the env step of the first gradient
    step, of the last one up to any end, and of the first target copy that follows one, as the arithmetic says."""
    draw = random.Random(0)
    for trial in range(40):
        N, T = draw.choice([1, 2, 3, 4]), draw.choice([1, 2, 3, 5])
        L, F, B, every = draw.randint(0, 60), draw.randint(1, 40), draw.randint(1, 50), draw.randint(1, 120)
        settings = DQNSettings(rollout_len=T, train_frequency=F, learning_starts=L, batch_size=B, buffer_size=10**5,
                               target_network_frequency=every)
        dqn, U = DQN(CARTPOLE, settings, num_envs=N, device=CPU, model=SMALL), N * T
        schedule = UpdateSchedule(F, 1)
        ready, owed_from, first = schedule.first_round(per_call=U, learning_starts=L, batch_at=B + N)
        rng, last, env_steps, rounds, synced = np.random.default_rng(trial), None, 0, [], None
        while env_steps < first + 2 * (every + F + U):
            rollout = stream(CARTPOLE, T, N, rng, last)
            last, steps, sync = rollout.next_obs[-1], dqn.gradient_steps_taken, dqn.last_target_sync
            dqn.learn(rollout, progress=0.5)
            env_steps += U
            rounds += [env_steps] if dqn.gradient_steps_taken > steps else []
            if synced is None and rounds and dqn.last_target_sync != sync:
                synced = env_steps
        case = dict(N=N, T=T, L=L, F=F, B=B, every=every)
        assert rounds[0] == first, case
        assert synced == first_trained_sync(every, per_call=U, ready=ready, first_round=first), case
        for end in range(first, env_steps + 1, U):
            assert schedule.last_round(owed_from, per_call=U, end=end) == max(r for r in rounds if r <= end), case


# (overrides, the line): debug=smoke's updates are algo.rollout_len (64) x env.num_envs (4) = 256 env steps
NEVER_A_ROUND = [
    (["algo=dqn", "experiment=none", "algo.learning_starts=0", "algo.train_frequency=1000", "total_env_steps=512"],
     "total_env_steps=512 ends at env step 512, before the first round of updates: the env steps owed count from "
     "algo.learning_starts=0, and algo.train_frequency=1000 of them make it due in the update that reaches env step "
     "1024: no gradient step would ever be taken; set total_env_steps >= 1024 or algo.train_frequency <= 512"),
    (["algo=rainbow", "experiment=none", "algo.learning_starts=300", "algo.train_frequency=600",
      "total_env_steps=768"],
     "total_env_steps=768 ends at env step 768, before the first round of updates: the env steps owed count from "
     "algo.learning_starts=300, and algo.train_frequency=600 of them make it due in the update that reaches env step "
     "1024: no gradient step would ever be taken; set total_env_steps >= 1024 or algo.train_frequency <= 468"),
    # the batch is held after the second update (256 + 4 held back): its 256 steps count, from env step 256
    (["algo=sac", "env=pendulum", "experiment=none", "algo.learning_starts=0", "algo.train_frequency=600",
      "total_env_steps=512"],
     "total_env_steps=512 ends at env step 512, before the first round of updates: the env steps owed count from "
     "env step 256, where the update that first leaves algo.batch_size=256 sampleable starts, and "
     "algo.train_frequency=600 of them make it due in the update that reaches env step 1024: no gradient step would "
     "ever be taken; set total_env_steps >= 1024 or algo.train_frequency <= 256"),
    (["algo=td3", "env=pendulum", "experiment=none", "algo.learning_starts=0", "algo.train_frequency=300",
      "total_env_steps=512"], "make it due in the update that reaches env step 768: no gradient step would ever be "
                              "taken; set total_env_steps >= 768 or algo.train_frequency <= 256"),
    (["algo=ddpg", "env=pendulum", "experiment=none", "algo.learning_starts=0", "algo.train_frequency=300",
      "total_env_steps=512"], "set total_env_steps >= 768 or algo.train_frequency <= 256"),
    # hindsight relabelling samples the same transitions: the same rounds
    (["algo=dqn", *GOALS, "env.id=bench_envs:BitFlip", "experiment=none", "algo.learning_starts=0",
      "algo.train_frequency=1000", "total_env_steps=512"],
     "set total_env_steps >= 1024 or algo.train_frequency <= 512"),
    (["algo=td3", *GOALS, "env.id=bench_envs:PointReach", "algo.learning_starts=0", "algo.train_frequency=300",
      "total_env_steps=512"], "set total_env_steps >= 768 or algo.train_frequency <= 256"),
    # behind actors the learner's updates merge trainer.batch_rollouts rollouts (here 2 x 4 envs x 64 steps)
    (["algo=dqn", *GOALS, "env.id=bench_envs:BitFlip", "trainer=subprocess_actors", "trainer.num_actors=2",
      "algo.learning_starts=0", "algo.train_frequency=1000", "total_env_steps=512"],
     "total_env_steps=512 ends at env step 512, before the first round of updates"),
    (["trainer=parallel", "trainer.num_agents=2", "algo=sac", "env=pendulum", "experiment=none",
      "algo.learning_starts=0", "algo.train_frequency=600", "total_env_steps=1024"],
     "trainer=parallel: agent 0 of 2 gets 512 of total_env_steps=1024: total_env_steps=512 ends at env step 512, "
     "before the first round of updates"),
]


@pytest.mark.parametrize(("overrides", "message"), NEVER_A_ROUND, ids=[" ".join(o) for o, _ in NEVER_A_ROUND])
def test_a_budget_that_ends_before_the_first_round_is_refused_by_rltrain_and_rltrain_check(tmp_path, overrides,
                                                                                            message):
    resolved, _ = resolve_experiment([*SMOKE, *overrides])
    with pytest.raises(ConfigError) as err:
        build.run(compose_cfg([*SMOKE, *overrides]), tmp_path / "run")
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "run" / "summary.json").exists()
    console = Console(record=True, width=600)
    assert check.check(resolved, console) == 2
    assert message in console.export_text().replace("\n", "")


# 3 envs x 2 steps = 6 env steps per update; the batch (32 + 3 held back) is in by the warm-up's end (50, in the
# update reaching 54), and 20 steps owed from 50 fall due in the update reaching 72
ROUNDS = [*SMOKE, "algo=dqn", "experiment=none", "env.num_envs=3", "algo.rollout_len=2", "algo.learning_starts=50",
          "algo.batch_size=32", "algo.train_frequency=20", "log.every_env_steps=6", "eval.every_env_steps=0",
          "eval.episodes=1", "checkpoint.every_env_steps=0", "model.hidden_sizes=[16]"]


def _losses(run_dir) -> list[str]:
    return [row["loss/q"] for row in read_metrics(run_dir / "metrics.csv") if row.get("loss/q") not in (None, "")]


def test_the_values_the_line_names_take_a_gradient_step_and_one_update_less_does_not(tmp_path):
    with pytest.raises(ConfigError, match=r"total_env_steps=66 ends at env step 66, .* due in the update that reaches "
                                          r"env step 72: .* set total_env_steps >= 72 or algo.train_frequency <= 16$"):
        build.run(compose_cfg([*ROUNDS, "total_env_steps=66"]), tmp_path / "short")
    for name, works in (("budget", ["total_env_steps=72"]), ("whole", ["total_env_steps=67"]),
                        ("frequency", ["total_env_steps=66", "algo.train_frequency=16"])):
        summary = build.run(compose_cfg([*ROUNDS, *works]), tmp_path / name)
        assert summary["status"] == "completed" and _losses(tmp_path / name), name


def test_the_cli_says_it_in_one_line_exits_2_and_leaves_no_run_dir(tmp_path):
    res = run_cli(["algo=dqn", "experiment=none", "env.num_envs=1", "algo.learning_starts=100",
                   "algo.train_frequency=50", "total_env_steps=120", "hydra.run.dir=run"], cwd=tmp_path, timeout=120,
                  env={"PYTHONPATH": _pythonpath()})
    assert res.returncode == 2, res.stderr[-3000:]
    assert [line for line in res.stderr.splitlines() if line.strip()] == [
        "rltrain: error: total_env_steps=120 ends at env step 120, before the first round of updates: the env steps "
        "owed count from algo.learning_starts=100, and algo.train_frequency=50 of them make it due in the update that "
        "reaches env step 150: no gradient step would ever be taken; set total_env_steps >= 150 or "
        "algo.train_frequency <= 20"]
    assert not (tmp_path / "run").exists() and not (tmp_path / "outputs").exists()


# one env, one step per update: the batch is in by the warm-up's end (100), the rounds fall at 104, 108, ...; a target
# copied every 200 env steps first takes trained weights at 200, and the round after it comes at 204
TARGET = [*SMOKE, "algo=dqn", "experiment=none", "env.num_envs=1", "algo.rollout_len=1", "algo.learning_starts=100",
          "algo.train_frequency=4", "eval.every_env_steps=0", "eval.episodes=1", "checkpoint.every_env_steps=0",
          "log.every_env_steps=100", "model.hidden_sizes=[16]", "algo.target_network_frequency=200"]
LATE = ("warning: algo.target_network_frequency=200: the target network first takes trained weights in the update "
        "that reaches env step 200, and the run's last round of updates comes at env step 200 (total_env_steps=203), "
        "so every TD target comes from the initial, untrained network; set e.g. algo.target_network_frequency=104 or "
        "total_env_steps >= 204")


def test_a_target_network_that_would_never_take_trained_weights_is_a_warning_and_the_run_goes_on(tmp_path, capsys,
                                                                                                   caplog):
    """``rltrain`` says it through rltrain's logger (Hydra's job logging shows it: test_tool_wording.py),
    ``rltrain-check`` prints it; a value that works is named as an example (a shorter frequency can wait for a
    later copy)."""
    summary = build.run(compose_cfg([*TARGET, "total_env_steps=203"]), tmp_path / "late")
    assert summary["status"] == "completed"  # a warning, not a refusal: the generic default is longer than smoke tests
    said = [r for r in caplog.records if r.name.startswith("rltrain") and r.levelname == "WARNING"]
    assert [f"{r.levelname.lower()}: {r.getMessage()}" for r in said] == [LATE]
    assert "warning" not in capsys.readouterr().err
    resolved, _ = resolve_experiment([*TARGET, "total_env_steps=203"])
    assert check.check(resolved, Console(record=True, width=600)) == 0
    assert f"rltrain-check: {LATE}" in capsys.readouterr().err.splitlines()
    for name, works in (("budget", ["total_env_steps=204"]), ("frequency", ["total_env_steps=203",
                                                                            "algo.target_network_frequency=104"])):
        caplog.clear()
        build.run(compose_cfg([*TARGET, *works]), tmp_path / name)
        assert "target network" not in capsys.readouterr().err + caplog.text, name
        counters = torch.load(tmp_path / name / "checkpoints" / "final.pt", weights_only=False)["algo"]["counters"]
        # a copy after a gradient step, and gradient steps after it: rounds at 104, 108, ... (one step each)
        synced = counters["last_target_sync"]
        assert synced >= 104 and counters["gradient_steps"] > (synced - 100) // 4, (name, counters)


def test_a_one_frame_stack_is_refused_in_one_line_naming_what_works(tmp_path):
    with pytest.raises(ConfigError) as err:
        build.run(compose_cfg([*SMOKE, "algo=dqn", "algo.frame_stack=1"]), tmp_path / "run")
    assert str(err.value) == ("algo.frame_stack=1: K >= 2, 0 (whole stacks stored) or null (inferred) (a stack of 1 "
                              "frame is the observation itself, stored whole as 0 does); set algo.frame_stack=null")
    assert not (tmp_path / "run" / "summary.json").exists()
    build.build_trainer(build.prepare(compose_cfg([*SMOKE, "algo=dqn", "algo.frame_stack=0"])), tmp_path / "run")


@pytest.mark.parametrize("algo", ["dqn", "rainbow", "sac", "td3", "ddpg"])
def test_her_k_typed_without_her_is_said_unread_by_every_replay_learner(algo):
    from rltrain.cli.unread import unread_lines

    env = [] if algo in ("dqn", "rainbow") else ["env=pendulum"]
    overrides = [*SMOKE, f"algo={algo}", *env, "algo.her_k=8"]
    settings = build.settings_from(build.prepare(compose_cfg(overrides)))
    assert "algo.her_k=8 is not read: only algo.her=true uses it (now false)" in unread_lines(settings, overrides)


def _checked(overrides: list[str], capsys) -> tuple[int, str]:
    """rltrain-check's exit code and its lines (table and stderr) for one job."""
    resolved, _ = resolve_experiment(overrides)
    console = Console(record=True, width=2000)
    code = check.check(resolved, console)
    return code, console.export_text().replace("\n", " ") + capsys.readouterr().err


# (overrides, what the line says, overrides that each pass): CartPole's DQN preset, 4 envs x 1 step per update
WARM_UP = [
    (["algo=dqn", "total_env_steps=1000"],
     "total_env_steps=1000 <= algo.learning_starts=1000: no gradient step would ever be taken; set total_env_steps >= "
     "1128 or algo.learning_starts <= 872", [["total_env_steps=1128"], ["total_env_steps=1000",
                                                                       "algo.learning_starts=872"]]),
    (["algo=dqn", "trainer=parallel", "trainer.num_agents=2", "total_env_steps=2000"],
     "trainer=parallel: agent 0 of 2 gets 1000 of total_env_steps=2000: total_env_steps=1000 <= "
     "algo.learning_starts=1000: no gradient step would ever be taken; set total_env_steps >= 2256 (1128 for each "
     "agent) or algo.learning_starts <= 872", [["total_env_steps=2256"], ["total_env_steps=2000",
                                                                         "algo.learning_starts=872"]]),
    # the whole run's 6000 would fill a batch; each agent's 3000 does not, and only the agents' checks speak
    (["algo=dqn", "trainer=parallel", "trainer.num_agents=2", "algo.batch_size=5872", "total_env_steps=6000"],
     "trainer=parallel: agent 0 of 2 gets 3000 of total_env_steps=6000: total_env_steps=3000 puts 3000 transitions "
     "into the replay (2996 sampleable: the newest of each env stream (4) waits for its successor), fewer than "
     "algo.batch_size=5872: no gradient step would ever be taken; set total_env_steps >= 12000 (6000 for each agent) "
     "or algo.batch_size <= 2872", [["total_env_steps=12000"], ["total_env_steps=6000", "algo.batch_size=2872"]]),
    # shares 667, 667, 666: the smallest is checked first, and what it suggests fits the others
    (["algo=dqn", "trainer=parallel", "trainer.num_agents=3", "total_env_steps=2000"],
     "trainer=parallel: agent 2 of 3 gets 666 of total_env_steps=2000: total_env_steps=666 <= "
     "algo.learning_starts=1000: no gradient step would ever be taken; set total_env_steps >= 3384 (1128 for each "
     "agent) or algo.learning_starts <= 540", [["total_env_steps=3384"]]),
    (["algo=dqn", "trainer=parallel", "trainer.num_agents=2", "total_env_steps=2010"],
     "trainer=parallel: agent 0 of 2 gets 1005 of total_env_steps=2010: total_env_steps=1005 ends at env step 1008, "
     "before the first round of updates: the env steps owed count from algo.learning_starts=1000, and "
     "algo.train_frequency=128 of them make it due in the update that reaches env step 1128: no gradient step would "
     "ever be taken; set total_env_steps >= 2256 (1128 for each agent) or algo.train_frequency <= 8",
     [["total_env_steps=2256"]]),
]


@pytest.mark.parametrize(("overrides", "message", "fixes"), WARM_UP, ids=[" ".join(o) for o, _, _ in WARM_UP])
def test_a_refused_budget_names_values_that_pass_and_under_parallel_totals_that_give_each_agent_its_need(
        overrides, message, fixes, capsys):
    code, said = _checked(overrides, capsys)
    assert code == 2 and message in said, said
    for fix in fixes:
        code, said = _checked([*overrides, *fix], capsys)
        assert code == 0 and "error:" not in said, (fix, said)  # it trains (a target warning may follow: below)


def test_the_budgets_the_target_network_warning_names_under_parallel_are_totals_that_silence_it(capsys):
    """Each agent's 1128 syncs too late; 1256 each, 2512 in all, does not (nor does the 3 agents' 3768)."""
    for agents, total, enough in ((2, 2256, "total_env_steps >= 2512 (1256 for each agent)"),
                                  (3, 3383, "total_env_steps >= 3768 (1256 for each agent)")):
        run = ["algo=dqn", "trainer=parallel", f"trainer.num_agents={agents}"]
        code, said = _checked([*run, f"total_env_steps={total}"], capsys)
        assert code == 0 and f"so every TD target comes from the initial, untrained network; set {enough}" in said, said
        code, said = _checked([*run, f"total_env_steps={enough.split()[2]}"], capsys)
        assert code == 0 and "target network" not in said, said


def test_the_warm_up_the_line_names_is_the_largest_that_trains(capsys):
    """Every value at or below it trains (the first round never comes later for a shorter warm-up); one more does
    not, for one run and for the smallest of three agents' shares."""
    for run, starts in ((["algo=dqn", "total_env_steps=1000"], 872), (["algo=dqn", "total_env_steps=5000"], 4872),
                        (["algo=dqn", "trainer=parallel", "trainer.num_agents=3", "total_env_steps=2000"], 540)):
        for value in (0, starts // 2, starts):
            assert _checked([*run, f"algo.learning_starts={value}"], capsys)[0] == 0, (run, value)
        code, said = _checked([*run, f"algo.learning_starts={starts + 1}"], capsys)
        assert code == 2 and "before the first round of updates" in said, (run, said)
