"""The ``rltrain`` command as a user runs it: a subprocess, real files, real exit codes."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, run_cli

SMOKE = ["debug=smoke", "logger.progress=plain"]


def _run_dir(root: Path) -> Path:
    dirs = [p.parent for p in root.glob("outputs/runs/*/*/config.yaml")]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One smoke run from the CLI (its default run dir) shared by the tests that check its files, its output and
    ``rltrain-eval`` on it; a test that writes into the run dir works on a copy."""
    root = tmp_path_factory.mktemp("smoke")
    res = run_cli([*SMOKE, "seed=3"], cwd=root)
    assert res.returncode == 0, res.stderr
    return res, _run_dir(root)


def test_smoke_run_writes_every_artefact(smoke_run):
    res, run_dir = smoke_run
    for name in (".hydra/config.yaml", ".hydra/overrides.yaml", "config.yaml", "seeds.json", "metrics.csv",
                 "summary.json", "checkpoints/final.pt", "checkpoints/best.pt"):
        assert (run_dir / name).exists(), name
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["total_env_steps"] >= 2048
    for key in ("final_eval_return", "wall_time_s", "sps"):
        assert isinstance(summary[key], float), key
    seeds = json.loads((run_dir / "seeds.json").read_text())
    assert seeds["root_seed"] == 3 and len(seeds["workers"]["main"]["env_seeds"]) == 4
    header = (run_dir / "metrics.csv").read_text().splitlines()[0].split(",")
    for col in ("env_steps", "time/wall", "time/sps", "rollout/episode_return", "rollout/episode_return_min",
                "rollout/episode_return_max", "loss/policy", "loss/value", "loss/entropy", "train/approx_kl",
                "train/clip_frac", "train/lr", "eval/return_mean"):
        assert col in header, col
    # plain progress lines off a TTY, and a summary line
    assert "[training]" in res.stdout and "[summary]" in res.stdout
    # TensorBoard scalars use slash namespaces
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    assert {"rollout/episode_return", "loss/policy", "time/sps", "eval/return_mean"} <= set(acc.Tags()["scalars"])


def test_seed_null_draws_and_records(cli, tmp_path):
    res = cli(*SMOKE, "seed=null", "total_env_steps=512")
    assert res.returncode == 0, res.stderr
    seeds = json.loads((_run_dir(tmp_path) / "seeds.json").read_text())
    assert seeds["drawn"] is True and isinstance(seeds["root_seed"], int)


BAD_INPUTS = [
    (["env.id=CartPol-v1"], "did you mean 'CartPole-v1'"),
    (["algo=nope"], "unknown option algo=nope (valid: "),
    (["trainer=nope"], "unknown option trainer=nope"),
    (["algo.lrr=0.1"], "algo.lrr: unknown key; did you mean 'lr'? (valid: action_mask, rollout_len"),
    (["+algo.lrr=0.1"], "algo.lrr: unknown key; did you mean 'lr'? (valid: action_mask, rollout_len"),
    (["algo.lr=fast"], "algo.lr='fast' has the wrong type: expected float"),
    (["hydra.run.dir=runs/a=b"], "Error parsing override 'hydra.run.dir=runs/a=b': mismatched input '='"),
    (["algo.update_epochs=2.5"], "algo.update_epochs=2.5 has the wrong type: expected int (a count: a whole"),
    (["total_env_steps=-5"], "total_env_steps=-5 must be a positive integer"),
    (["total_env_steps=0"], "total_env_steps=0 must be a positive integer"),
    (["env.num_envs=0"], "env.num_envs=0 must be a positive integer"),
    (["algo.rollout_len=-1"], "algo.rollout_len=-1 must be > 0"),
    (["algo.num_minibatches=3"], "does not divide the batch: algo.rollout_len (64) x env.num_envs (4) = 256"),
    (["resume=/no/such/ckpt.pt"], "resume=/no/such/ckpt.pt: no such checkpoint"),
    (["device=cuda"], "CUDA is not available"),
    (["device=tpu"], "device='tpu' is not one of"),
    (["env.id=no_such_pkg.mod:Env"], "env.id=no_such_pkg.mod:Env: cannot import 'no_such_pkg.mod'"),
    (["max_wall_time=soon"], "max_wall_time='soon' is not a duration"),
    (["algo=sac"], "algo=sac needs a Box action space; env.id=CartPole-v1 is Discrete(2): choose an algorithm that "
                   "takes its actions (algo=ppo, algo=a2c and algo=impala take every kind), or try algo=sac on "
                   "env=pendulum"),
    (["algo=dqn", "env=pendulum"], "algo=dqn needs a Discrete action space; env.id=Pendulum-v1 is Box"),
    (["algo=dqn", "trainer=distributed_simulator"],
     "algo=dqn is off-policy and its replay updates are not all-reduced"),
    (["env=atari", "env.id=ALE/Tetris-v5", "target_return=${env.solved_return}"],
     "target_return=${env.solved_return} is null: env.id=ALE/Tetris-v5 has no reference score"),
]


@pytest.mark.parametrize(("args", "expected"), BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_clear_line(cli, args, expected):
    if args == ["device=cuda"] and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    res = cli(*SMOKE, *args, timeout=120)
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("rltrain: error: ")
    assert expected in lines[0], lines[0]
    assert "Traceback" not in res.stderr


def test_resume_path_that_is_not_a_checkpoint(cli, tmp_path):
    bogus = tmp_path / "bogus.pt"
    bogus.write_bytes(b"not a checkpoint")
    res = cli(*SMOKE, f"resume={bogus}")
    assert res.returncode == 2
    assert res.stderr.strip() == f"rltrain: error: resume={bogus}: not an rltrain checkpoint (UnpicklingError)" or \
        "not an rltrain checkpoint" in res.stderr


def test_missing_box2d_extra_is_named(cli):
    pytest.importorskip("gymnasium")
    try:
        import Box2D  # noqa: F401

        pytest.skip("box2d is installed here")
    except ImportError:
        pass
    res = cli(*SMOKE, "env=lunarlander")
    assert res.returncode == 2
    assert "pip install 'rltrain[box2d]'" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_user_env_by_import_path_with_kwargs(cli, tmp_path):
    res = cli(*SMOKE, "env.id=tests.helpers.faulty_envs:make_counting", "+env.kwargs.length=7", "total_env_steps=512",
              env={"PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr
    summary = json.loads((_run_dir(tmp_path) / "summary.json").read_text())
    assert summary["env_id"] == "tests.helpers.faulty_envs:make_counting"
    assert summary["final_eval_return"] <= 7.0  # one reward per step at most, 7 steps per episode


def test_help_and_cfg_job(cli):
    """--help shows the generic defaults (the settings dataclasses'), names the preset experiment=auto would add
    and the docs page of each group; --cfg job shows what a run composes (the preset included)."""
    res = cli("--help")
    assert res.returncode == 0 and "== Configuration groups ==" in res.stdout
    assert "rltrain: train" in res.stdout
    assert "algo: a2c, ddpg, dqn, impala, ippo, mappo, ppo, pqn, rainbow, sac, td3" in res.stdout
    assert "  lr: 0.0003\n" in res.stdout and "  rollout_len: null\n" in res.stdout  # PPOSettings, not ppo_cartpole
    assert "experiment=auto (the default) adds experiment=ppo_cartpole (tuned for algo=ppo on CartPole-v1)" in \
        res.stdout
    for page in ("docs/getting-started.md", "docs/reference/config.md", "docs/algorithms/<name>.md",
                 "docs/scaling/parallel.md", "docs/scaling/distributed.md", "docs/scaling/subprocess-actors.md",
                 "docs/scaling/ray.md", "docs/scaling/slurm.md", "docs/guide/own-env.md", "docs/guide/recurrent.md",
                 "docs/guide/pixels.md", "docs/guide/checkpoints.md", "docs/guide/trackers.md", "docs/guide/sweeps.md",
                 "docs/trust.md", "docs/guide/multi-agent.md"):
        assert page in res.stdout, page
    res = cli("--help", "algo=sac", "env=pendulum")
    assert res.returncode == 0 and "adds experiment=sac_pendulum" in res.stdout and "  policy_lr: 0.0003" in res.stdout
    res = cli("--cfg", "job", "algo.lr=0.001")
    assert res.returncode == 0 and "lr: 0.001" in res.stdout and "rollout_len: 64" in res.stdout  # ppo_cartpole's
    # overrides before the flag: the preset's override joins them, not the flag's value (argparse would refuse it)
    res = cli("algo=dqn", "algo.lr=0.002", "--cfg", "job")
    assert res.returncode == 0 and "lr: 0.002" in res.stdout and "target_network_frequency: 128" in res.stdout, \
        res.stderr


def test_whole_floats_are_counts_and_recorded_as_integers(cli, tmp_path):
    res = cli("debug=smoke", "logger=quiet", "total_env_steps=1.024e3", "eval.every_env_steps=5.12e2",
              "algo.rollout_len=3.2e1", "hydra.run.dir=run")
    assert res.returncode == 0, res.stderr
    import yaml

    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (cfg["total_env_steps"], cfg["eval"]["every_env_steps"], cfg["algo"]["rollout_len"]) == (1024, 512, 32)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["total_env_steps"] == 1024


def test_multirun_job_dirs_carry_no_escape_characters(cli, tmp_path):
    """Hydra's override_dirname escapes ':' (env.id=pkg\\:Env) and a '/' in a value would nest directories: job
    dirs are '<num>_<overrides as plain text>', without a timestamp (a requeued job finds its dir)."""
    from rltrain.cli.resolvers import job_dir

    assert job_dir(3, r"env.id=pkg\:Env,seed=1") == "3_env.id=pkg-Env,seed=1"
    assert job_dir(0, "env.id=ALE/Pong-v5,trainer.scopes=[2,3]") == "0_env.id=ALE-Pong-v5,trainer.scopes=2,3"
    assert job_dir(7, "") == "7_" and len(job_dir(1, "a=" + "x" * 500)) <= 2 + 120
    # cut past 120 characters, the seed kept: an Optuna trial's seeds stay told apart by name
    long = ",".join(f"algo.k{i}=0.00064664227175{i}" for i in range(8))
    assert job_dir(0, long + ",seed=2").endswith(",seed=2") and len(job_dir(0, long + ",seed=2")) <= 2 + 120
    assert job_dir(1, "seed=3," + long).startswith("1_seed=3,") and job_dir(1, "seed=3," + long).count("seed=") == 1
    res = cli("-m", "debug=smoke", "logger=quiet", "env.id=tests.helpers.faulty_envs:make_counting",
              "total_env_steps=256", "eval.episodes=1", "seed=1,2", "hydra.sweep.dir=sweep",
              env={"PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr
    names = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert names == [f"{n}_debug=smoke,env.id=tests.helpers.faulty_envs-make_counting,eval.episodes=1,logger=quiet,"
                     f"seed={n + 1},total_env_steps=256" for n in (0, 1)], names


def test_a_long_job_dir_name_is_cut_between_overrides_never_inside_a_value():
    """A value cut short names another value (total_env_steps=20 for 2048): the name keeps whole overrides only,
    a list value's commas not taken for the end of an override."""
    from rltrain.cli.resolvers import MAX_NAME, job_dir

    sweep = ("+env.kwargs.N=2,+env.kwargs.continuous_actions=False,+env.kwargs.max_cycles=25,algo.clip_coef=0.1,"
             "algo.ent_coef=0.008516764670113516,algo.lr=0.0006466422717414558,seed=1")
    assert job_dir(0, sweep) == ("0_+env.kwargs.N=2,+env.kwargs.continuous_actions=False,+env.kwargs.max_cycles=25,"
                                 "algo.clip_coef=0.1,seed=1")
    team = ("algo.policies={scout:fast,pilot:slow,clerk:slow},algo=ippo,env.id=my_envs\\:make_team,"
            "logger.progress=off,total_env_steps=2048")
    assert job_dir(0, team) == "0_algo.policies=scout-fast,pilot-slow,clerk-slow,algo=ippo,env.id=my_envs-make_team,"\
                               "logger.progress=off"
    listed = "model.hidden_sizes=[" + ",".join(["256"] * 30) + "],seed=4"
    assert job_dir(2, listed).endswith(",seed=4") and len(job_dir(2, listed)) <= 2 + MAX_NAME


def test_a_used_run_dir_keeps_its_record_and_refuses_a_fresh_start(smoke_run, cli, tmp_path):
    """A command refused at start leaves the finished run's config.yaml as it was (resume=auto compares against
    it); starting afresh over a run's checkpoints is refused in one line; resume=auto continues that run."""
    bare = shutil.copytree(smoke_run[1], tmp_path / "bare", ignore=shutil.ignore_patterns("checkpoints"))
    before = (bare / "config.yaml").read_bytes()
    res = cli(*SMOKE, "seed=3", "env.id=CartPol-v1", f"hydra.run.dir={bare}")  # refused by the env's probe
    assert res.returncode == 2 and "did you mean 'CartPole-v1'" in res.stderr, res.stderr
    assert (bare / "config.yaml").read_bytes() == before
    run_dir = shutil.copytree(smoke_run[1], tmp_path / "run")
    res = cli(*SMOKE, "seed=3", f"hydra.run.dir={run_dir}")
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert f"hydra.run.dir={run_dir} holds an earlier run's checkpoints (checkpoints/best.pt, " \
           "checkpoints/final.pt" in lines[0] and "resume=auto continues that run" in lines[0], lines[0]
    assert (run_dir / "config.yaml").read_bytes() == before  # the same run's record as the bare copy's
    steps = json.loads((run_dir / "summary.json").read_text())["total_env_steps"]
    res = cli(*SMOKE, "seed=3", "resume=auto", f"total_env_steps={steps + 512}", f"hydra.run.dir={run_dir}")
    assert res.returncode == 0, res.stderr
    assert json.loads((run_dir / "summary.json").read_text())["total_env_steps"] >= steps + 512


def test_sigint_checkpoints_and_prints_resume_command(tmp_path, no_leaks):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    args = [sys.executable, "-m", "rltrain", "env.id=tests.helpers.faulty_envs:SlowEnv", "total_env_steps=1000000",
            "logger.progress=plain", "logger.progress_interval_s=0.2", "algo.rollout_len=16", "algo.num_minibatches=2"]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list(tmp_path.glob("outputs/runs/*/*/metrics.csv")):
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    run_dir = _run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["stop_reason"] == "SIGINT"
    assert "resume=auto" in err and f"hydra.run.dir={run_dir}" in err
    assert "Traceback" not in err
    steps = summary["total_env_steps"]
    assert steps > 0 and list((run_dir / "checkpoints").glob("step_*.pt"))
    # the printed command resumes: counters continue from the checkpoint
    cmd = shlex.split(summary["resume_command"])[1:]
    cmd = [c for c in cmd if not c.startswith("total_env_steps=")] + [f"total_env_steps={steps + 64}"]
    res = subprocess.run([sys.executable, "-m", "rltrain", *cmd], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["total_env_steps"] >= steps + 64


def test_rltrain_eval_on_run_dir_and_checkpoint(smoke_run, tmp_path):
    _, run_dir = smoke_run
    for target in (run_dir, run_dir / "checkpoints" / "best.pt"):
        res = subprocess.run([sys.executable, "-m", "rltrain.cli.evaluate", str(target), "--episodes", "3"],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert "episodes: 3  mean return:" in res.stdout
    res = subprocess.run([sys.executable, "-m", "rltrain.cli.evaluate", str(tmp_path / "nothing")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.startswith("rltrain-eval: error:")


def test_rltrain_eval_video_needs_extra_or_records(smoke_run, tmp_path):
    run_dir = shutil.copytree(smoke_run[1], tmp_path / "run")  # the videos go into the run dir
    cmd = [sys.executable, "-m", "rltrain.cli.evaluate", str(run_dir), "eval.episodes=1", "eval.video=true"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    try:
        import moviepy  # noqa: F401
    except ImportError:
        assert res.returncode == 2 and "pip install 'rltrain[video]'" in res.stderr
        return
    assert res.returncode == 0, res.stderr
    assert list((run_dir / "videos").glob("*.mp4"))


def test_rich_progress_mode_runs_and_prints_summary_table(tmp_path, capsys):
    from rltrain.cli.build import run
    from tests.conftest import compose_cfg

    summary = run(compose_cfg(["debug=smoke", "total_env_steps=512", "logger.progress=rich"]), tmp_path)
    assert summary["status"] == "completed"
    out = capsys.readouterr().out
    assert "rltrain summary" in out and "final_eval_return" in out


def test_the_docs_pages_help_names_exist():
    """--help names a page of the docs site for each group (rltrain/cli/resolvers.py DOCS); once the site is in
    the repository (mkdocs.yml), every page it names must exist."""
    import re

    from rltrain.cli.resolvers import DOCS
    from rltrain.cli.schema import options

    pages = {p for _, text in DOCS for p in re.findall(r"docs/[\w/<>.-]+\.md", text)}
    algos = dict(DOCS)["algo=<name>"]
    named = set(re.findall(r"\w+", algos.partition("(")[2].partition(";")[0]))
    elsewhere = dict(re.findall(r"(\w+) on (\w+)\.md", algos))
    # every algorithm has a page: its own (named in the line), a sibling's (named "x on y.md") or multi-agent's
    for algo in options("algos"):
        assert algo in named | set(elsewhere) or f"algo={algo}" in " ".join(k for k, _ in DOCS), algo
    pages = {p.replace("<name>", algo) for p in pages for algo in [*named, *elsewhere.values()]}
    assert len(pages) >= 15
    if not (REPO / "mkdocs.yml").exists():
        pytest.skip("the docs site (mkdocs.yml, docs/) is not in this checkout yet")
    assert sorted(p for p in pages if not (REPO / p).exists()) == []
