"""rltrain-report labels and figures, and the progress output around a run."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rltrain.cli import report
from rltrain.run.metrics import read_metrics
from tests.conftest import run_cli

SMOKE = ["debug=smoke", "total_env_steps=1024", "env.num_envs=2"]


def _fake_job(sweep: Path, num: int, overrides: list[str], cfg: dict, ret: float) -> Path:
    """A job dir as a multirun writes it: summary.json, config.yaml, metrics.csv, .hydra/overrides.yaml."""
    job = sweep / f"{num}_{','.join(overrides)}"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (job / "config.yaml").write_text(yaml.safe_dump(cfg))
    (job / "summary.json").write_text(json.dumps({"status": "completed", "final_eval_return": ret, "seed": cfg["seed"],
                                                  "wall_time_s": 1.0}))
    rows = "\n".join(f"{s},{ret * s / 4000:.2f}" for s in range(1000, 5000, 1000))
    (job / "metrics.csv").write_text("env_steps,rollout/episode_return\n" + rows + "\n")
    return job


def _sweep_of_groups(root: Path, n_groups: int) -> Path:
    sweep = root / "multirun"
    num = 0
    for g in range(n_groups):
        for seed in (1, 2):
            lr = 10.0 ** -(2 + g % 4)
            width = 32 * (1 + g // 4)
            overrides = [f"algo.lr={lr:g}", f"algo.hidden_sizes=[{width},{width}]", f"seed={seed}"]
            cfg = {"seed": seed, "algo": {"lr": lr, "hidden_sizes": [32 * (1 + g // 4)] * 2, "gamma": 0.99},
                   "env": {"id": "CartPole-v1"}, "logger": {"progress": "plain"}}
            _fake_job(sweep, num, overrides, cfg, 100.0 + g)
            num += 1
    return sweep


def test_labels_are_the_typed_overrides_that_differ(tmp_path):
    sweep = _sweep_of_groups(tmp_path, 3)
    groups = report.group_runs([report.load_run(r) for r in report.find_runs([sweep])])
    assert sorted(groups) == ["algo.lr=0.0001", "algo.lr=0.001", "algo.lr=0.01"]  # hidden_sizes is the same
    assert all(len(runs) == 2 for runs in groups.values())  # seeds aggregated, seed never in a label


def test_two_swept_keys_label_both(tmp_path):
    sweep = _sweep_of_groups(tmp_path, 5)
    groups = report.group_runs([report.load_run(r) for r in report.find_runs([sweep])])
    assert "algo.lr=0.01 algo.hidden_sizes=[64,64]" in groups and len(groups) == 5


def test_without_overrides_files_labels_fall_back_to_resolved_keys(tmp_path):
    sweep = _sweep_of_groups(tmp_path, 2)
    for f in sweep.glob("*/.hydra/overrides.yaml"):
        f.unlink()
    groups = report.group_runs([report.load_run(r) for r in report.find_runs([sweep])])
    assert sorted(groups) == ["algo.lr=0.001", "algo.lr=0.01"]


@pytest.mark.parametrize("n_groups", [2, 12])
def test_png_grid_titles_do_not_overlap(tmp_path, n_groups):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = _sweep_of_groups(tmp_path, n_groups)
    groups = report.group_runs([report.load_run(r) for r in report.find_runs([sweep])])
    seen = []
    orig = plt.Figure.savefig

    def spy(fig, *args, **kwargs):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        seen.extend(ax.title.get_window_extent(renderer) for ax in fig.axes if ax.get_visible())
        width, height = fig.get_size_inches()
        assert width <= 20 and height <= 14, "a figure this large is unreadable when shown on a screen"
        return orig(fig, *args, **kwargs)

    plt.Figure.savefig = spy
    try:
        png = report.plot(groups, tmp_path / "curves.png", "rollout/episode_return")
    finally:
        plt.Figure.savefig = orig
    assert png is not None and png.stat().st_size > 10_000
    assert len(seen) == n_groups
    for i, a in enumerate(seen):
        for b in seen[i + 1:]:
            assert not a.overlaps(b), "two subplot titles overlap"


def _two_envs(root: Path, seeds: int) -> Path:
    """CartPole returns near 100, Pendulum's near -1000: two configurations, ``seeds`` seeds each."""
    sweep, num = root / "multirun", 0
    for env, ret in (("CartPole-v1", 100.0), ("Pendulum-v1", -1000.0)):
        for seed in range(1, seeds + 1):
            cfg = {"seed": seed, "algo": {"lr": 0.001}, "env": {"id": env}}
            _fake_job(sweep, num, [f"env.id={env}", f"seed={seed}"], cfg, ret + seed)
            num += 1
    return sweep


def _figure_of(monkeypatch, tmp_path, sweep):
    """The report's figure, caught before it is closed: [(title, ylim, legend texts)] per visible subplot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seen = []
    orig = plt.Figure.savefig

    def spy(fig, *args, **kwargs):
        for ax in fig.axes:
            if ax.get_visible():
                legend = ax.get_legend()
                seen.append((ax.get_title(), ax.get_ylim(), [t.get_text() for t in legend.get_texts()]))
        return orig(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", spy)
    groups = report.group_runs([report.load_run(r) for r in report.find_runs([sweep])])
    assert report.plot(groups, tmp_path / "curves.png", "rollout/episode_return") is not None
    return seen


def test_rows_name_the_env_and_algo_where_runs_differ_in_them_untyped(tmp_path):
    """A sweep over env=... beside one over algo=...: neither typed the other's key, and the rows still say which
    env and which algorithm each is."""
    sweep = tmp_path / "multirun"
    for num, (overrides, algo, env) in enumerate([(["env=acrobot"], "PPO", "Acrobot-v1"),
                                                  (["env=cartpole"], "PPO", "CartPole-v1"),
                                                  (["algo=a2c"], "A2C", "CartPole-v1")]):
        cfg = {"seed": 1, "algo": {"_target_": f"rltrain.algos.{algo.lower()}.{algo}"}, "env": {"id": env}}
        _fake_job(sweep, num, overrides, cfg, 100.0)
    groups = report.group_runs([report.load_run(r) for r in report.find_runs([sweep])])
    assert sorted(groups) == ["algo=a2c env.id=CartPole-v1", "env=acrobot algo=ppo env.id=Acrobot-v1",
                              "env=cartpole algo=ppo env.id=CartPole-v1"], sorted(groups)


def test_unfinished_runs_are_named_and_wall_time_counts_completed_runs(tmp_path, capsys):
    sweep = _sweep_of_groups(tmp_path, 1)
    live, dead = sorted(sweep.iterdir())
    for job, pid in ((live, os.getpid()), (dead, 2**22 + 12345)):  # this process; a pid no process has
        (job / "summary.json").write_text(json.dumps({"status": "running", "pid": pid, "host": socket.gethostname(),
                                                      "final_eval_return": None, "wall_time_s": 0.0}))
    cfg = {"seed": 3, "algo": {"lr": 0.01, "hidden_sizes": [32, 32], "gamma": 0.99}, "env": {"id": "CartPole-v1"},
           "logger": {"progress": "plain"}}
    _fake_job(sweep, 7, ["algo.lr=0.01", "algo.hidden_sizes=[32,32]", "seed=3"], cfg, 100.0)
    report.main([str(sweep), "--json"])
    out, err = capsys.readouterr()
    (row,) = json.loads(out)
    assert row["runs"] == 3 and row["completed"] == 1 and row["wall_time_s"] == 1.0  # not (1 + 0 + 0) / 3
    assert f"{live} is still running (pid {os.getpid()}" in err
    assert f"{dead} says running, but its process (pid {2**22 + 12345}) is gone" in err
    assert json.loads((dead / "summary.json").read_text())["status"] == "running"  # read only


def test_each_env_gets_a_subplot_with_its_own_y_axis(tmp_path, monkeypatch):
    seen = _figure_of(monkeypatch, tmp_path, _two_envs(tmp_path, 5))
    assert [title for title, _, _ in seen] == ["env.id=CartPole-v1", "env.id=Pendulum-v1"]
    (_, cart, _), (_, pend, _) = seen
    assert cart[0] > 0 and pend[1] < -200  # neither squashed into the other's scale
    assert all("rough" not in text for _, _, legend in seen for text in legend)


def test_intervals_from_fewer_than_5_seeds_are_labelled_and_warned(tmp_path, monkeypatch):
    sweep = _two_envs(tmp_path, 2)
    seen = _figure_of(monkeypatch, tmp_path, sweep)
    assert all("95% CI of mean (n=2 < 5 seeds: rough)" in legend for _, _, legend in seen)
    out = subprocess.run([sys.executable, "-m", "rltrain.cli.report", str(sweep), "--out", str(tmp_path / "r.md")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if "warning" in line]
    assert warnings == ["rltrain-report: warning: 95% intervals from fewer than 5 seeds are rough: "
                        "env.id=CartPole-v1 (n=2), env.id=Pendulum-v1 (n=2); run more seeds (seed=1,2,3,4,5) "
                        "before comparing"]
    md = (tmp_path / "r.md").read_text()
    assert md.count("(n<5)") == 2 and "fewer than 5 seeds" in md


def test_one_run_shows_no_interval():
    from rltrain.cli.report import summarize, table_cells

    one, two = summarize({"one": [{"summary": {"status": "completed", "final_eval_return": 52.5}}],
                          "two": [{"summary": {"status": "completed", "final_eval_return": v}} for v in (1.0, 3.0)]})
    assert table_cells(one)[5] == "-" and table_cells(two)[5] == "[1.0, 3.0] (n<5)"
    from rltrain.cli.report import few_seeds_warning

    assert few_seeds_warning([one]) is None  # no interval, no warning about one
    assert "two (n=2)" in few_seeds_warning([one, two]) and "one (n=1)" not in few_seeds_warning([one, two])


def test_five_seeds_give_no_warning(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rltrain.cli.report", str(_two_envs(tmp_path, 5)), "--json"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "warning" not in out.stderr


def _files(root: Path) -> set[Path]:
    return {f for f in root.rglob("*") if f.is_file()}


@pytest.mark.parametrize("flags", [[], ["--json"]], ids=["table", "json"])
def test_the_report_writes_nothing_it_was_not_asked_for(tmp_path, monkeypatch, capsys, flags):
    """Run dirs and the sweep dir are records of runs: a report reads them and leaves them (and the current
    dir) as they were; --json puts nothing but the JSON on stdout."""
    sweep = _sweep_of_groups(tmp_path / "runs", 2)
    parallel = tmp_path / "runs" / "parallel"  # a trainer=parallel run dir: the agents are its runs
    for k, job in enumerate(sorted(sweep.iterdir())[:2]):
        shutil.copytree(job, parallel / f"agent_{k}")
    (parallel / "summary.json").write_text(json.dumps({"status": "completed"}))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = _files(tmp_path)
    for paths in ([*sorted(sweep.iterdir())[:2]], [sweep], [parallel]):
        report.main([*map(str, paths), *flags])
        out, err = capsys.readouterr()
        assert _files(tmp_path) == before and "wrote" not in err, err
        if flags:
            assert json.loads(out)  # all of stdout is the JSON
    report.main([str(sweep), *flags, "--plot", str(work / "curves.png")])
    assert (work / "curves.png").stat().st_size > 1000 and f"wrote {work / 'curves.png'}" in capsys.readouterr().err
    report.main([str(sweep), "--out", str(work / "md" / "r.md"), "--plot", str(work / "curves.png")])
    assert "![learning curves](../curves.png)" in (work / "md" / "r.md").read_text()  # the link finds the PNG
    assert _files(tmp_path) - before == {work / "curves.png", work / "md" / "r.md"}

def test_a_figure_asked_for_a_column_no_run_has_is_a_warning_naming_the_near_columns(tmp_path, capsys):
    """--plot / --out with a --column no metrics.csv has (an agent's column misspelt) wrote no figure and said
    nothing: one warning line says so, with the columns it may have meant, also quoted in the markdown."""
    sweep = _sweep_of_groups(tmp_path / "runs", 1)
    for job in sweep.iterdir():  # a team's run: each agent's evaluation column
        (job / "metrics.csv").write_text("env_steps,eval/return_mean,eval/return_mean/scout\n1000,1.0,2.0\n")
    report.main([str(sweep), "--plot", str(tmp_path / "c.png"), "--column", "eval/return_mean/scuot"])
    err = capsys.readouterr().err
    assert not (tmp_path / "c.png").exists() and "wrote" not in err
    assert ("rltrain-report: warning: no figure written: no run's metrics.csv has a value in column "
            "'eval/return_mean/scuot' (--column); did you mean 'eval/return_mean/scout'") in err, err
    report.main([str(sweep), "--out", str(tmp_path / "r.md"), "--column", "eval/return_mean/scout"])
    assert "no figure written" not in capsys.readouterr().err and (tmp_path / "r.png").exists()
    report.main([str(sweep), "--out", str(tmp_path / "q.md"), "--column", "nothing"])
    text = (tmp_path / "q.md").read_text()
    assert "> no figure written: no run's metrics.csv has a value in column 'nothing'" in text, text


@pytest.mark.slow
def test_report_on_a_real_multirun_labels_by_algo(tmp_path):
    res = run_cli(["-m", "algo=ppo,a2c", *SMOKE, f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr
    out = subprocess.run([sys.executable, "-m", "rltrain.cli.report", str(tmp_path / "sweep"), "--json"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert sorted(r["group"] for r in json.loads(out.stdout)) == ["algo=a2c", "algo=ppo"]


# -- progress output (item 4) ------------------------------------------------------------------------------
def test_plain_progress_clamps_percent_and_eta(capsys):
    from rltrain.run.progress import ProgressDisplay

    p = ProgressDisplay(1000, mode="plain", interval_s=0.0)
    p.update(500, sps=100.0, episode_return=1.0)
    p.update(1024, sps=100.0, episode_return=1.0)  # the last rollout overshoots the budget
    lines = capsys.readouterr().out.splitlines()
    assert "(50%)" in lines[0]
    assert "1000/1000 steps (100%)" in lines[1] and "eta 0s" in lines[1]
    assert "-" not in lines[1].split("eta")[1]



def test_the_progress_total_is_where_the_run_of_whole_updates_ends(tmp_path, capsys):
    """total_env_steps=3000 in updates of 2048 runs to 4096: the display counts to the start line's figure, not
    to a budget the run passes (3000/3000 at 4096 steps)."""
    from rltrain.cli.build import run
    from tests.conftest import compose_cfg

    run(compose_cfg(["experiment=none", "total_env_steps=3000", "logger=quiet", "logger.progress=plain",
                     "logger.progress_interval_s=0", "eval.every_env_steps=0", "eval.episodes=1"]), tmp_path / "run")
    out = capsys.readouterr().out
    assert "[rltrain] budget: total_env_steps=3000 runs to 4096 env steps" in out
    lines = [line for line in out.splitlines() if line.startswith("[training]")]
    assert lines and all("/4096 steps (" in line for line in lines), lines
    assert lines[-1].startswith("[training] 4096/4096 steps (100%)"), lines

def test_eta_counts_the_rate_from_learning_starts_on():
    from rltrain.run.progress import EtaEstimate

    eta = EtaEstimate(100_000, rate_from=10_000)
    for k in range(11):  # random warm-up: 10,000 steps in 1 s
        eta.add(0.1 * k, 1000 * k)
    assert eta.seconds_left(10_000) is None  # one point after learning_starts gives no rate yet
    assert "learning starts at 10000" in eta.text(9_000)
    for k in range(1, 11):  # learning: 1,000 steps/s
        eta.add(1.0 + k, 10_000 + 1000 * k)
    # 80,000 steps left at 1,000/s; the whole run's mean rate (20,000 in 11 s) would say 44 s
    assert eta.seconds_left(20_000) == pytest.approx(80.0)
    assert eta.text(20_000) == "80s"


def test_eta_follows_the_last_minute():
    from rltrain.run.progress import RATE_WINDOW_S, EtaEstimate

    eta = EtaEstimate(1_000_000)
    t, steps = 0.0, 0
    for _ in range(100):  # fast for 100 s, then slow for two windows
        t, steps = t + 1, steps + 1000
        eta.add(t, steps)
    for _ in range(int(2 * RATE_WINDOW_S)):
        t, steps = t + 1, steps + 100
        eta.add(t, steps)
    assert eta.seconds_left(steps) == pytest.approx((1_000_000 - steps) / 100)


def test_summary_steps_per_second_leaves_out_evaluation(tmp_path):
    """Many long evaluations: the summary's sps counts training time only, the evaluations' time apart."""
    run_dir = tmp_path / "run"
    res = run_cli([*SMOKE, "total_env_steps=2048", "log.every_env_steps=512", "eval.every_env_steps=512",
                   "eval.episodes=30", "eval.deterministic=false", "logger.progress=off",
                   f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    training_s = summary["total_env_steps"] / summary["sps"]
    assert summary["eval_time_s"] > 0
    # wall_time_s (up to the last update) holds the periodic evaluations; the sps time does not
    assert training_s < summary["wall_time_s"] <= training_s + summary["eval_time_s"]
    rows = [r for r in read_metrics(run_dir / "metrics.csv") if r.get("eval/return_mean")]
    assert len(rows) >= 3


def _render(display) -> str:
    from rich.console import Console

    console = Console(width=120, file=io.StringIO(), record=True)
    console.print(*display._bar.get_renderables())
    return console.export_text()


def test_rich_progress_shows_rows_under_an_uncut_bar():
    from rltrain.run.progress import ProgressDisplay

    p = ProgressDisplay(150000, mode="rich", title="learner")
    try:
        p.update(150512, sps=5000.0, episode_return=200.0)  # the last rollout overshoots: shown as the total
        text_end = _render(p)
        p.update(93920, sps=5000.0, episode_return=200.0)
        p.set_rows([f"actor {k}: 2,400 sps  episodes {10 + k}  v41" for k in range(4)])
        text = _render(p)
    finally:
        p.close()
    assert "150000/150000" in text_end and "150512" not in text_end
    assert "93920/150000" in text
    assert "0/?" not in text and text.count("eta") == 1
    assert all(f"actor {k}: 2,400 sps  episodes {10 + k}  v41" in text for k in range(4))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> tuple[str, str, int, Path]:
    """One smoke run from the CLI: its first two stdout lines, its exit status and its run dir, shared by the
    test of the first output and the evaluation-video test (which works on a copy of the run dir)."""
    root = tmp_path_factory.mktemp("smoke")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-m", "rltrain", *SMOKE, "logger.progress=plain",
                             f"hydra.run.dir={root / 'run'}"], stdout=subprocess.PIPE, text=True, env=env, cwd=root)
    first, second = proc.stdout.readline(), proc.stdout.readline()
    proc.communicate(timeout=300)
    return first, second, proc.returncode, root / "run"


def test_first_output_is_printed_before_the_heavy_imports(smoke_run):
    first, second, returncode, _ = smoke_run
    # the experiment=auto line (resolved from the overrides before composition), then the start line
    assert first.startswith("[rltrain] preset experiment=ppo_cartpole"), first
    assert second.strip() == "[rltrain] starting ..."
    assert returncode == 0


def test_mujoco_warns_once_and_writes_no_log_in_cwd(tmp_path):
    pytest.importorskip("mujoco")
    code = ("import torch; torch.set_num_threads(1)\n"
            "from rltrain.envs.make import make_env\n"
            "envs = [make_env('HalfCheetah-v5') for _ in range(3)]\n"
            "[e.reset(seed=0) for e in envs]\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert (res.stdout + res.stderr).count("settotalmass") == 1
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()


def test_eval_video_prints_no_runtime_dir_noise(smoke_run, tmp_path):
    pytest.importorskip("moviepy")
    assert smoke_run[2] == 0
    shutil.copytree(smoke_run[3], tmp_path / "run")  # the videos go into the run dir
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    res = subprocess.run([sys.executable, "-m", "rltrain.cli.evaluate", str(tmp_path / "run"), "--episodes", "1",
                          "--video"], capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "XDG_RUNTIME_DIR" not in res.stdout + res.stderr
    assert list((tmp_path / "run" / "videos").glob("*.mp4"))


def test_training_with_eval_video_prints_no_sdl_noise(tmp_path):
    """eval.video=true in training renders CartPole with pygame: SDL's probes of a display and a sound server
    must not print (``XDG_RUNTIME_DIR is invalid``) on a headless machine, where the run succeeds."""
    pytest.importorskip("moviepy")
    pytest.importorskip("pygame")
    drop = ("XDG_RUNTIME_DIR", "SDL_VIDEODRIVER", "SDL_AUDIODRIVER", "DISPLAY", "WAYLAND_DISPLAY")
    env = {k: v for k, v in os.environ.items() if k not in drop and k != "HYDRA_FULL_ERROR"}  # a headless shell
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    res = subprocess.run([sys.executable, "-m", "rltrain", "debug=smoke", "logger=quiet", "total_env_steps=256",
                          "eval.every_env_steps=0", "eval.episodes=1", "eval.video=true", "hydra.run.dir=run"],
                         capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert list((tmp_path / "run" / "videos").glob("*.mp4"))
    assert res.stderr == "", res.stderr  # nothing on a successful run's stderr


def test_headless_sdl_keeps_the_users_drivers(monkeypatch):
    from rltrain.trainers.episodes import headless_sdl

    monkeypatch.setenv("SDL_VIDEODRIVER", "x11")
    monkeypatch.delenv("SDL_AUDIODRIVER", raising=False)
    headless_sdl()
    assert os.environ["SDL_VIDEODRIVER"] == "x11" and os.environ["SDL_AUDIODRIVER"] == "dummy"


NOISY_ENV = '''
import sys

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class NoisyCartPole(CartPoleEnv):
    """Prints a long line in pieces on every reset: without whole-line writes, agents' pieces would mix."""

    def reset(self, **kwargs):
        sys.stdout.write("noisy-begin ")
        for _ in range(40):
            sys.stdout.write("piece ")
            sys.stdout.flush()
        sys.stdout.write("noisy-end\\n")
        print("warned on stderr", file=sys.stderr)
        return super().reset(**kwargs)


gym.register("NoisyCartPole-v0", entry_point=NoisyCartPole, max_episode_steps=50)
'''


def test_parallel_agents_own_lines_are_prefixed_and_whole_without_a_tty(tmp_path):
    (tmp_path / "noisy_env.py").write_text(NOISY_ENV)
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{Path(__file__).resolve().parents[1]}"}
    res = run_cli([*SMOKE, "trainer=parallel", "env.id=noisy_env:NoisyCartPole-v0", "logger.progress=plain",
                   f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=400, env=env)
    assert res.returncode == 0, res.stderr
    whole = "noisy-begin " + "piece " * 40 + "noisy-end"
    noisy = [line for line in res.stdout.splitlines() if "noisy-" in line or "piece" in line]
    assert noisy, res.stdout[-2000:]
    # the parent probes the env once itself (its own line, unprefixed); every agent line is prefixed; none mixed
    agents = [line.partition("] ")[0] for line in noisy if line != whole]
    assert all(line in (whole, f"[agent_0] {whole}", f"[agent_1] {whole}") for line in noisy), noisy
    assert set(agents) == {"[agent_0", "[agent_1"} and len(agents) > len(noisy) // 2
    warned = [line for line in res.stderr.splitlines() if "warned on stderr" in line]
    assert sum(line.startswith("[agent_") for line in warned) > len(warned) // 2
    assert all(line in ("warned on stderr", "[agent_0] warned on stderr", "[agent_1] warned on stderr")
               for line in warned)
    # the closing line's interval over 2 agents says it rests on fewer than 5 seeds, as rltrain-report does
    (final,) = [line for line in res.stdout.splitlines() if line.startswith("[parallel] ")]
    assert "(95% CI " in final and "; n=2 < 5 seeds: rough), median " in final, final


def test_an_off_policy_run_shows_no_eta_until_learning_starts(tmp_path):
    res = run_cli(["debug=smoke", "algo=dqn", "total_env_steps=2048", "algo.learning_starts=1024", "env.num_envs=2",
                   "log.every_env_steps=256", "logger.progress=plain", "logger.progress_interval_s=0",
                   f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stdout.splitlines() if line.startswith("[training] ")]
    steps = [int(line.split()[1].split("/")[0]) for line in lines]
    before = [line for s, line in zip(steps, lines, strict=True) if s < 1024]
    after = [line for s, line in zip(steps, lines, strict=True) if s >= 1024 + 256]
    assert before and all(line.endswith("eta - (learning starts at 1024)") for line in before)
    assert after and all(re.search(r"eta \d+s$", line) for line in after)


def test_the_table_shows_a_groups_overrides_as_typed_brackets_included(capsys, monkeypatch):
    """rich read ``[env.wrappers]``-like text in a cell as a style tag and dropped it: a group labelled
    ``+env.wrappers=[clip]`` printed as ``+env.wrappers=``."""
    from rltrain.cli.report import print_table

    monkeypatch.setenv("COLUMNS", "300")
    row = {"group": "+env.wrappers=[clip],algo=ppo", "n": 1, "runs": 1, "mean": 1.0, "median": 1.0, "iqm": 1.0,
           "ci95_mean": None, "wall_time_s": 2.0, "failed": 0}
    print_table([row], "t")
    assert "+env.wrappers=[clip],algo=ppo" in capsys.readouterr().out
