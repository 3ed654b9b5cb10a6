"""Determinism, checkpoint round trip and bitwise resume (sequential, CPU)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rltrain.cli.build import run
from rltrain.run.checkpoint import CheckpointManager, load_checkpoint
from rltrain.run.metrics import WALL_CLOCK_PREFIX, read_metrics
from tests.conftest import compose_cfg

BASE = ["debug=smoke", "logger=quiet", "algo.anneal_lr=false", "eval.every_env_steps=1024"]


def _without_wall_clock(rows):
    return [{k: v for k, v in r.items() if not k.startswith(WALL_CLOCK_PREFIX)} for r in rows]


def test_same_seed_same_metrics(tmp_path):
    for name in ("a", "b"):
        run(compose_cfg(BASE + ["seed=7"]), tmp_path / name)
    a, b = (read_metrics(tmp_path / n / "metrics.csv") for n in ("a", "b"))
    assert len(a) >= 4
    assert _without_wall_clock(a) == _without_wall_clock(b)
    c = read_metrics(run(compose_cfg(BASE + ["seed=8"]), tmp_path / "c") and tmp_path / "c" / "metrics.csv")
    assert _without_wall_clock(a) != _without_wall_clock(c)


@pytest.mark.parametrize("extra", [[], ["env=pendulum", "algo.norm_obs=true", "algo.norm_reward=true"]],
                         ids=["cartpole", "pendulum-normalised"])
def test_resume_is_bitwise_identical(tmp_path, extra):
    n = 2048
    run(compose_cfg(BASE + extra + [f"total_env_steps={2 * n}"]), tmp_path / "once")
    run(compose_cfg(BASE + extra + [f"total_env_steps={n}"]), tmp_path / "twice")
    summary = run(compose_cfg(BASE + extra + [f"total_env_steps={2 * n}", "resume=auto"]), tmp_path / "twice")
    assert summary["total_env_steps"] == 2 * n
    once, _ = load_checkpoint(tmp_path / "once" / "checkpoints" / "final.pt")
    twice, _ = load_checkpoint(tmp_path / "twice" / "checkpoints" / "final.pt")
    p1, p2 = once["algo"]["policy"], twice["algo"]["policy"]
    assert p1.keys() == p2.keys()
    for k in p1:
        assert torch.equal(p1[k], p2[k]), k
    assert once["counters"]["updates"] == twice["counters"]["updates"]
    # metrics continue where they stopped: same rows (bar wall clock) as the uninterrupted run
    a = _without_wall_clock(read_metrics(tmp_path / "once" / "metrics.csv"))
    b = _without_wall_clock(read_metrics(tmp_path / "twice" / "metrics.csv"))
    assert [r["env_steps"] for r in a] == [r["env_steps"] for r in b]
    assert a[-2] == b[-2]


def test_checkpoint_round_trip_loads_weights_only(tmp_path):
    run(compose_cfg(BASE), tmp_path)
    mgr = CheckpointManager(tmp_path / "checkpoints")
    latest = mgr.latest()
    assert latest is not None
    state = torch.load(latest, weights_only=True)  # plain containers only: RNG states included
    assert {"algo", "counters", "rng", "collector", "meta"} <= state.keys()
    assert isinstance(state["rng"]["numpy"], dict)
    assert state["counters"]["env_steps"] == 2048
    # keep_last prunes the periodic ones; best and final are kept
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("*.pt"))
    assert "final.pt" in names and "best.pt" in names
    assert len([n for n in names if n.startswith("step_")]) <= 3
    # loading into a fresh algorithm restores the same parameters
    from rltrain.cli.build import algo_factory
    from rltrain.envs.make import env_spec, make_env

    spec = env_spec(make_env("CartPole-v1"), "CartPole-v1")
    algo = algo_factory(state["meta"]["config"])(spec, num_envs=4, device=torch.device("cpu"))
    algo.load_state_dict(state["algo"])
    for k, v in algo.state_dict()["policy"].items():
        assert torch.equal(v, state["algo"]["policy"][k])


PEERS = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "scripts" / "peers")
OFF_POLICY = {
    "td3": ["algo=td3", "env=pendulum"],
    "ddpg": ["algo=ddpg", "env=pendulum"],
    # hindsight relabelling draws goals at sampling time: the resumed run draws the same ones
    "sac_her": ["algo=sac", "env.id=bench_envs:PointReach", f"env.search_path={PEERS}", "algo.her=true"],
}


@pytest.mark.parametrize("case", list(OFF_POLICY))
def test_off_policy_resume_is_bitwise_identical(tmp_path, case):
    """N steps + resume + N == 2N steps at once, for the replay learners with their buffer checkpointed: every
    metrics row (wall clock aside) and every final weight, the critics' and the targets' included."""
    base = ["debug=smoke", "logger=quiet", *OFF_POLICY[case], "experiment=none", "env.num_envs=2",
            "algo.rollout_len=4", "algo.learning_starts=200", "algo.batch_size=32", "algo.buffer_size=2000",
            "model.hidden_sizes=[16,16]", "checkpoint.replay_buffer=true", "eval.every_env_steps=0",
            "log.every_env_steps=128", "checkpoint.every_env_steps=256"]
    run(compose_cfg([*base, "total_env_steps=512"]), tmp_path / "once")
    run(compose_cfg([*base, "total_env_steps=256"]), tmp_path / "twice")
    summary = run(compose_cfg([*base, "total_env_steps=512", "resume=auto"]), tmp_path / "twice")
    assert summary["resumed_from_env_steps"] == 256
    once, _ = load_checkpoint(tmp_path / "once" / "checkpoints" / "final.pt")
    twice, _ = load_checkpoint(tmp_path / "twice" / "checkpoints" / "final.pt")
    for net in [k for k in once["algo"] if k not in ("counters", "replay_buffer") and "optimizer" not in k]:
        ours, theirs = once["algo"][net], twice["algo"][net]
        for k, v in (ours.items() if isinstance(ours, dict) else [("", ours)]):  # SAC's log_alpha: a tensor
            assert torch.equal(v, theirs[k] if k else theirs), (net, k)
    assert once["algo"]["counters"] == twice["algo"]["counters"] and once["algo"]["counters"]["gradient_steps"] > 0
    # the N run's final evaluation lands in its last row (256): the only cells allowed to differ
    a, b = ([{k: v for k, v in r.items() if not k.startswith("eval/")}
             for r in _without_wall_clock(read_metrics(tmp_path / name / "metrics.csv"))] for name in ("once", "twice"))
    assert a == b and len(a) == 4
    if case == "sac_her":
        assert "rollout/success_rate" in a[-1] and "train_success_rate_last100" in summary
    else:  # an env that reports no info["is_success"] gets no success columns
        assert "rollout/success_rate" not in a[-1] and "final_eval_success_rate" not in summary


def test_a_resume_that_takes_no_step_ends_as_the_uninterrupted_run(tmp_path, monkeypatch):
    """A run stopped in its final evaluation (its final checkpoint written), then resumed, takes no step: its
    final row carries the last update's losses and its summary the training rate of the session that trained,
    as the uninterrupted run's do (both travel in the checkpoint); resuming a finished run changes neither."""
    import signal

    from rltrain.run.signals import StopRequested
    from rltrain.trainers.evaluation import Evaluation

    cfg = BASE + ["total_env_steps=1024"]
    once = run(compose_cfg(cfg), tmp_path / "once")
    evaluate = Evaluation.__call__

    def stopped_in_final(self, *, final=False):
        if final:
            raise StopRequested(signal.SIGTERM, "SIGTERM")
        return evaluate(self, final=final)

    monkeypatch.setattr(Evaluation, "__call__", stopped_in_final)
    stopped = run(compose_cfg(cfg), tmp_path / "twice")
    assert stopped["status"] == "interrupted" and stopped["sps"] > 0
    monkeypatch.setattr(Evaluation, "__call__", evaluate)
    resumed = run(compose_cfg(cfg + ["resume=auto"]), tmp_path / "twice")
    assert resumed["status"] == "completed" and resumed["sps"] == stopped["sps"], (stopped["sps"], resumed["sps"])
    rows_once, rows_twice = (read_metrics(tmp_path / n / "metrics.csv") for n in ("once", "twice"))
    assert _without_wall_clock(rows_twice) == _without_wall_clock(rows_once)
    assert float(rows_twice[-1]["time/sps"]) == pytest.approx(stopped["sps"])
    assert any(k.startswith("loss/") for k in rows_twice[-1]), rows_twice[-1]  # the last update's losses

    again = run(compose_cfg(cfg + ["resume=auto"]), tmp_path / "once")  # a finished run, resumed
    assert again["sps"] == once["sps"] and again["final_eval_return"] == once["final_eval_return"]
    assert read_metrics(tmp_path / "once" / "metrics.csv") == rows_once


@pytest.mark.parametrize("keep", [False, True], ids=["buffer-dropped", "buffer-kept"])
def test_a_resume_without_the_replay_buffer_says_so_at_start(tmp_path, capsys, keep):
    """checkpoint.replay_buffer=false: the resumed run's buffer starts empty (the warm-up is not repeated, the
    updates wait for one batch); a start line says so and how to keep it, none where it was kept."""
    base = ["debug=smoke", "logger=quiet", "logger.progress=plain", "algo=dqn", "experiment=none", "env.num_envs=2",
            "algo.rollout_len=4", "algo.learning_starts=200", "algo.batch_size=32", "algo.buffer_size=2000",
            "model.hidden_sizes=[16,16]", "eval.every_env_steps=0", "checkpoint.every_env_steps=256",
            f"checkpoint.replay_buffer={str(keep).lower()}"]
    run(compose_cfg([*base, "total_env_steps=256"]), tmp_path / "run")
    capsys.readouterr()
    summary = run(compose_cfg([*base, "total_env_steps=512", "resume=auto"]), tmp_path / "run")
    assert summary["resumed_from_env_steps"] == 256
    said = [line for line in capsys.readouterr().out.splitlines() if "replay buffer" in line]
    if keep:
        assert said == []
        return
    assert len(said) == 1 and said[0].startswith(f"[rltrain] resume from {tmp_path / 'run' / 'checkpoints'}/")
    assert said[0].endswith(": the replay buffer was not checkpointed (checkpoint.replay_buffer=false): it starts "
                            "empty; updates wait until it holds algo.batch_size=32 transitions (about 32 env steps), "
                            "then sample only what was collected since the resume until it fills up again; "
                            "checkpoint.replay_buffer=true keeps it in checkpoints"), said


@pytest.mark.parametrize("target", [None, 0.0], ids=["no_target", "target_reached_there"])
def test_a_periodic_evaluation_cut_by_a_stop_runs_on_resume(tmp_path, monkeypatch, target):
    """A stop during the periodic evaluation at 2048 checkpoints there; the resume runs that evaluation before
    training on: metrics.csv (its row at 2048 with the eval columns), the best evaluation and the final weights are
    the uninterrupted run's. With ``eval.target_return`` reached by that evaluation, the resume ends there, with
    no update after it, as the uninterrupted run did."""
    import signal

    from rltrain.run.signals import StopRequested
    from rltrain.trainers.evaluation import Evaluation

    cfg = BASE + ["total_env_steps=4096"]
    if target is not None:
        cfg = BASE + ["total_env_steps=4096", "eval.every_env_steps=2048", f"eval.target_return={target}"]
    tracked = target is None and importlib.util.find_spec("mlflow") is not None
    if tracked:  # the tracker had the step's row without its evaluation: it gets the evaluation on resume
        cfg = [*cfg, "logger.sinks=[csv,mlflow]"]
    once = run(compose_cfg(cfg), tmp_path / "once")
    evaluate = Evaluation._evaluate

    def cut_at_2048(self, final):
        if not final and self.state.counters["env_steps"] == 2048:
            self.stop.request("SIGTERM")
            raise StopRequested(signal.SIGTERM, "SIGTERM")
        return evaluate(self, final)

    monkeypatch.setattr(Evaluation, "_evaluate", cut_at_2048)
    stopped = run(compose_cfg(cfg), tmp_path / "twice")
    assert stopped["status"] == "interrupted" and stopped["total_env_steps"] == 2048, stopped
    monkeypatch.setattr(Evaluation, "_evaluate", evaluate)
    resumed = run(compose_cfg(cfg + ["resume=auto"]), tmp_path / "twice")
    assert resumed["status"] == "completed"
    assert resumed["total_env_steps"] == once["total_env_steps"] == (2048 if target is not None else 4096)
    rows_once, rows_twice = (read_metrics(tmp_path / n / "metrics.csv") for n in ("once", "twice"))
    assert [r for r in rows_once if r["env_steps"] == "2048" and r.get("eval/return_mean")], rows_once
    assert _without_wall_clock(rows_twice) == _without_wall_clock(rows_once)
    assert resumed["best_eval_return"] == once["best_eval_return"]
    best = [load_checkpoint(tmp_path / n / "checkpoints" / "best.pt")[0]["counters"]["env_steps"]
            for n in ("once", "twice")]
    assert best[0] == best[1], best
    p1, p2 = (load_checkpoint(tmp_path / n / "checkpoints" / "final.pt")[0]["algo"]["policy"]
              for n in ("once", "twice"))
    assert all(torch.equal(p1[k], p2[k]) for k in p1)
    if tracked:
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        evals = []
        for name in ("once", "twice"):
            client = MlflowClient(tracking_uri=str(tmp_path / name / "mlruns"))
            (tracked_run,) = client.search_runs([client.get_experiment_by_name("rltrain").experiment_id])
            evals.append({m.step: m.value for m in client.get_metric_history(tracked_run.info.run_id,
                                                                              "eval/return_mean")})
        assert 2048 in evals[0] and evals[1] == evals[0], evals
