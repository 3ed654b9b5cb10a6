"""Tracebacks instead of one line, in the tools around a run: a checkpoint write that the kernel
refuses inside torch.save's zip writer, absurd network widths, crafted checkpoints given to rltrain-eval and
rltrain-export, rltrain-report on malformed files and on a symlink loop, and rltrain-check agreeing with rltrain.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_faults import _stderr_lines, _summary, _temp_files, _train


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    res = _train(run_dir)
    assert res.returncode == 0, res.stderr
    return run_dir


def _tool(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=180,
                          cwd=cwd)


def test_a_checkpoint_write_refused_inside_the_zip_writer_is_one_line(tmp_path):
    """``ulimit -f``: the kernel refuses the write (EFBIG); torch.save reports a RuntimeError of its own."""
    run_dir = tmp_path / "run"
    res = _train(run_dir, module="tests.helpers.file_size_limit", env={"RLTRAIN_FSIZE_LIMIT": "30000"})
    assert res.returncode == 2, res.stderr[-3000:]
    lines = [ln for ln in _stderr_lines(res) if not ln.startswith("[")]
    assert len(lines) == 1 and "File too large" in lines[0] and ".best.pt.tmp" in lines[0], res.stderr
    assert _summary(run_dir)["status"] == "failed"
    assert _temp_files(run_dir) == []


@pytest.mark.parametrize("key", ["model.hidden_sizes", "model.hidden_sizes"])
def test_absurd_network_widths_are_refused_before_any_allocation(tmp_path, key):
    res = _train(tmp_path / "run", f"{key}=[1000000,1000000]")
    assert res.returncode == 2 and len(_stderr_lines(res)) == 1, res.stderr
    assert res.stderr.startswith(f"rltrain: error: {key}=[1000000, 1000000]: the networks would need about ")


def _crafted(finished: Path, dest: Path, edit) -> Path:
    state = torch.load(finished / "checkpoints" / "final.pt", weights_only=True)
    edit(state)
    torch.save(state, dest)
    return dest


@pytest.mark.parametrize("edit", [
    lambda s: s["meta"].pop("config"),
    lambda s: s["meta"]["config"].pop("algo"),
    lambda s: s["meta"]["config"]["env"].update(num_envs="many"),
    lambda s: s["algo"].update(policy={"nonsense": torch.zeros(3)}),
    lambda s: s["meta"].update(eval_seed="x"),
], ids=["no-config", "no-algo", "bad-num-envs", "foreign-weights", "bad-eval-seed"])
@pytest.mark.parametrize("tool", ["rltrain.cli.evaluate", "rltrain.cli.export"])
def test_a_crafted_checkpoint_is_one_line_in_eval_and_export(finished, tmp_path, edit, tool):
    ckpt = _crafted(finished, tmp_path / "crafted.pt", edit)
    args = ["--episodes", "1"] if tool.endswith("evaluate") else ["--out", str(tmp_path / "policy.pt")]
    res = _tool(tool, str(ckpt), *args, cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    assert len(_stderr_lines(res)) == 1 and "Traceback" not in res.stderr, res.stderr
    assert str(ckpt) in res.stderr


def test_a_video_folder_inside_a_checkpoint_chooses_nothing(finished, tmp_path):
    target = tmp_path / "elsewhere"
    ckpt = _crafted(finished, tmp_path / "crafted.pt", lambda s: s["meta"]["config"]["env"].update(
        wrappers=[{"RecordVideo": {"video_folder": str(target)}}]))
    res = _tool("rltrain.cli.evaluate", str(ckpt), "--episodes", "1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not target.exists()
    assert "ignoring its env.wrappers entry RecordVideo" in res.stderr


def test_report_survives_a_symlink_loop_and_malformed_files(finished, tmp_path):
    sweep = tmp_path / "sweep"
    good = sweep / "0_good"
    good.mkdir(parents=True)
    for name in ("summary.json", "config.yaml", "metrics.csv"):
        (good / name).write_bytes((finished / name).read_bytes())
    (sweep / "loop").symlink_to(sweep, target_is_directory=True)  # a link to an ancestor
    (sweep / "nested").mkdir()
    (sweep / "nested" / "back").symlink_to(sweep, target_is_directory=True)
    bad_json = sweep / "1_bad_json"
    bad_json.mkdir()
    (bad_json / "summary.json").write_text("{not json")
    not_object = sweep / "2_list"
    not_object.mkdir()
    (not_object / "summary.json").write_text("[1, 2]")
    bad_csv = sweep / "3_bad_csv"
    bad_csv.mkdir()
    (bad_csv / "summary.json").write_text(json.dumps({"status": "completed", "final_eval_return": "lots",
                                                       "wall_time_s": "long"}))
    (bad_csv / "metrics.csv").write_text("env_steps,rollout/episode_return\nabc,1\n\x00\x01,zz\n")
    bad_yaml = sweep / "4_bad_yaml"
    bad_yaml.mkdir()
    (bad_yaml / "summary.json").write_text(json.dumps({"status": "failed"}))
    (bad_yaml / "config.yaml").write_text("a: [unclosed\n")
    # --plot: the curves read every metrics.csv, the malformed one too; the timeout catches a hang
    res = _tool("rltrain.cli.report", str(sweep), "--json", "--plot", str(tmp_path / "curves.png"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    warnings = [ln for ln in _stderr_lines(res) if ln.startswith("rltrain-report: warning:")]
    assert any("1_bad_json" in w for w in warnings) and any("2_list" in w for w in warnings), warnings
    assert any("4_bad_yaml" in w for w in warnings) and any("3_bad_csv" in w for w in warnings), warnings
    rows = json.loads(res.stdout)
    assert sum(r["runs"] for r in rows) == 2  # the good run (once, despite two loops) and 3_bad_csv


@pytest.mark.parametrize("experiment", ["experiment=none", "experiment=auto", "experiment=ppo_cartpole"])
def test_check_judges_the_run_dir_rltrain_would_use_whatever_experiment_says(finished, tmp_path, experiment):
    """resolve_experiment drops experiment=none / auto (or adds a preset): the command is still one run."""
    res = _tool("rltrain.cli.check", "debug=smoke", experiment, f"hydra.run.dir={finished}", cwd=tmp_path)
    said = " ".join((res.stdout + res.stderr).split())  # rich wraps the line at the terminal's width
    assert res.returncode == 2 and f"hydra.run.dir={finished} holds an earlier run's checkpoints" in said, said
    assert "job(s) valid" not in said and "multirun" not in said
    if experiment == "experiment=none":  # rltrain refuses the very same command in the same words
        ran = _tool("rltrain", "debug=smoke", experiment, f"hydra.run.dir={finished}", cwd=tmp_path)
        assert ran.returncode == 2 and "holds an earlier run's checkpoints" in ran.stderr, ran.stderr[-2000:]


def test_check_is_a_multirun_exactly_when_rltrain_is(tmp_path):
    """-m makes one job a sweep job (its dir under hydra.sweep.dir), also where a preset is added; without -m a
    sweep value is refused, as rltrain refuses it."""
    sweep = tmp_path / "sweep"
    res = subprocess.run([sys.executable, "-m", "rltrain.cli.check", "-m", "debug=smoke", f"hydra.sweep.dir={sweep}"],
                         capture_output=True, text=True, timeout=180, cwd=tmp_path,
                         env={**os.environ, "COLUMNS": "400"})  # the dir on one table row
    said = " ".join(res.stdout.split())
    assert res.returncode == 0 and "preset experiment=ppo_cartpole" in said, said
    assert f"job 0 dir │ {sweep}/0" in said and "1/1 job(s) valid" in said, said
    res = _tool("rltrain.cli.check", "debug=smoke", "seed=1,2", cwd=tmp_path)
    assert res.returncode == 2 and "add --multirun" in res.stderr, res.stdout[-2000:] + res.stderr[-2000:]

def test_check_runs_the_checks_a_start_runs(finished, tmp_path):
    res = _tool("rltrain.cli.check", "debug=smoke", f"hydra.run.dir={finished}", "resume=auto",
                "trainer=parallel", cwd=tmp_path)
    assert res.returncode == 2 and "trainer._target_" in res.stdout + res.stderr, res.stdout[-3000:]
    res = _tool("rltrain.cli.check", "debug=smoke", "hydra.run.dir=/proc/rltrain/run", cwd=tmp_path)
    assert res.returncode == 2 and "cannot write there" in res.stdout + res.stderr, res.stdout[-3000:]
    res = _tool("rltrain.cli.check", "debug=smoke", "model.hidden_sizes=[1000000,1000000]", cwd=tmp_path)
    said = " ".join((res.stdout + res.stderr).split())  # rich wraps the line at the terminal's width
    assert res.returncode == 2 and "the networks would need" in said, res.stdout[-3000:]
    res = _tool("rltrain.cli.check", "debug=smoke", f"hydra.run.dir={finished}", "resume=auto", cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:]
