"""What rltrain writes, deletes and stores: only its own files, only its own temp names, only what the env sent.

A copied run dir whose files are links to elsewhere (their targets must survive a resume untouched), a
FIFO where rltrain writes, a user's own ``*.tmp*`` files in a reused dir, and envs whose integer observations
do not fit their space (a ``uint8`` Box handed 300, a grid declared ``0..10`` handed 300), sync and async.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tests.test_faults import _stderr_lines, _summary, _train

OUT = "env.id=tests.helpers.stuck_envs:OutOfBox"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("content") / "run"
    res = _train(run_dir)
    assert res.returncode == 0, res.stderr
    return run_dir


def _errors(res) -> list[str]:
    return [ln for ln in _stderr_lines(res) if not ln.startswith("[")]


# -- the run dir: links, non-regular files, temp names -------------------------------------------------------
def test_a_run_dir_whose_files_link_elsewhere_is_refused_and_the_targets_survive(trained, tmp_path):
    run_dir = shutil.copytree(trained, tmp_path / "copied", ignore=shutil.ignore_patterns(".rltrain.lock"))
    elsewhere = tmp_path / "someone_elses"
    elsewhere.mkdir()
    links = ["config.yaml", "seeds.json", "model.txt", ".rltrain.lock"]
    for name in links:
        target = elsewhere / name
        target.write_text(f"not yours: {name}\n")
        (run_dir / name).unlink(missing_ok=True)
        (run_dir / name).symlink_to(target)
    res = _train(run_dir, "resume=auto", "total_env_steps=3072")
    assert res.returncode == 2, res.stderr[-3000:]
    lines = _errors(res)
    assert len(lines) == 1 and "refusing to write into a run dir holding" in lines[0], res.stderr[-3000:]
    for name in links:
        assert f"{name} -> {elsewhere / name} (a link out of the run dir)" in lines[0], lines[0]
        assert (elsewhere / name).read_text() == f"not yours: {name}\n"  # untouched, the lock's too
    assert _summary(run_dir)["status"] == "completed"  # the run's own record stands


def test_a_trackers_own_links_do_not_stop_a_resume(trained, tmp_path):
    """wandb links its debug log out of the run dir (to ~/.cache/wandb) in every run: a tracker's own dir is its
    own, and resume=auto after a W&B run goes on; a link out of the run dir anywhere else is still refused."""
    from rltrain.run.lock import run_dir_offenders

    run_dir = shutil.copytree(trained, tmp_path / "copied", ignore=shutil.ignore_patterns(".rltrain.lock"))
    elsewhere = tmp_path / "cache" / "core-debug.log"
    elsewhere.parent.mkdir()
    elsewhere.write_text("wandb's\n")
    for tracker in ("wandb/offline-run-1/logs/debug-core.log", "mlruns/0/link", "agent_0/wandb/run/debug.log"):
        (run_dir / tracker).parent.mkdir(parents=True)
        (run_dir / tracker).symlink_to(elsewhere)
    assert run_dir_offenders(run_dir) == []
    (run_dir / "notes").mkdir()
    (run_dir / "notes" / "debug.log").symlink_to(elsewhere)
    assert run_dir_offenders(run_dir) == [f"notes/debug.log -> {elsewhere} (a link out of the run dir)"]
    (run_dir / "notes" / "debug.log").unlink()
    steps = _summary(run_dir)["total_env_steps"]
    res = _train(run_dir, "resume=auto", f"total_env_steps={steps + 1024}")
    assert res.returncode == 0, res.stderr[-3000:]
    assert elsewhere.read_text() == "wandb's\n"


def test_a_fifo_where_rltrain_writes_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / "metrics.csv")
    res = _train(run_dir)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = _errors(res)
    assert len(lines) == 1 and "metrics.csv (a FIFO, not a regular file)" in lines[0], lines


def test_only_rltrains_own_temp_names_are_swept(trained, tmp_path):
    run_dir = shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns(".rltrain.lock"))
    ours = [run_dir / ".summary.json.tmp4242", run_dir / "checkpoints" / ".step_000000003072.pt.tmp4242"]
    users = [run_dir / "notes.tmp", run_dir / ".draft.tmp1", run_dir / "data.tmp.csv",
             run_dir / "checkpoints" / ".mine.pt.tmp7", run_dir / "checkpoints" / "best.pt.tmp"]
    for path in ours + users:
        path.write_text("x")
    res = _train(run_dir, "resume=auto", "total_env_steps=3072")
    assert res.returncode == 0, res.stderr[-3000:]
    assert not any(p.exists() for p in ours)
    assert all(p.read_text() == "x" for p in users)  # the user's files, whatever their names


# -- observations that do not fit their space ----------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "what"), [
    ([], "observation value 300 (int64) at index (1,) does not fit the space's dtype uint8 "
         "(Box(0, 255, (3,), uint8)): it would be stored as 44"),
    (["+env.kwargs.high=10", "+env.kwargs.dtype=int64", "+env.kwargs.same_dtype=true"],
     "observation value 300 at index (1,) is above its high 10 (the observation space: Box(0, 10, (3,), int64))"),
], ids=["uint8-wraps", "outside-the-box"])
@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_an_observation_that_does_not_fit_its_space_ends_the_run_in_one_line(tmp_path, kwargs, what, vectorization):
    run_dir = tmp_path / "run"
    res = _train(run_dir, OUT, "env.num_envs=2", f"env.vectorization={vectorization}", *kwargs)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = _errors(res)
    assert len(lines) == 1, res.stderr[-3000:]
    assert re.match(r"rltrain: error: env 0 failed in step\(\) at its step 301: ObsOutOfSpace: ", lines[0]), lines[0]
    assert what in lines[0], lines[0]
    summary = _summary(run_dir)
    assert summary["status"] == "failed" and what in summary["error"]


# -- checkpoints: what the tools read, and what they may write over -------------------------------------------
def _tool(module: str, *args: str, cwd: Path):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def nan_checkpoint(trained, tmp_path_factory) -> Path:
    """The trained run's final checkpoint with one weight made NaN (as an altered file would hold it)."""
    import torch

    state = torch.load(trained / "checkpoints" / "final.pt", weights_only=True)
    name = next(k for k, v in state["algo"]["policy"].items() if v.is_floating_point() and v.numel() > 1
                and "norm" not in k)
    state["algo"]["policy"][name].view(-1)[0] = float("nan")
    path = tmp_path_factory.mktemp("altered") / "final.pt"
    torch.save(state, path)
    return path


@pytest.mark.parametrize("tool", ["rltrain.cli.evaluate", "rltrain.cli.export", "rltrain"])
def test_non_finite_weights_are_refused_naming_the_tensor(nan_checkpoint, tmp_path, tool):
    args = {"rltrain.cli.evaluate": [str(nan_checkpoint), "--episodes", "1"],
            "rltrain.cli.export": [str(nan_checkpoint), "--out", str(tmp_path / "p.pt2")],
            "rltrain": ["debug=smoke", "logger=quiet", f"resume={nan_checkpoint}", f"hydra.run.dir={tmp_path / 'r'}",
                        "total_env_steps=4096"]}[tool]
    res = _tool(tool, *args, cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    lines = _errors(res)
    assert len(lines) == 1 and "its weights are not finite: algo.policy." in lines[0], res.stderr[-3000:]
    assert "holds nan (1 of " in lines[0], lines[0]
    assert not (tmp_path / "p.pt2").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("tool", ["rltrain.cli.evaluate", "rltrain.cli.export", "rltrain"])
def test_a_fifo_given_as_a_checkpoint_is_refused_not_read(tmp_path, tool):
    fifo = tmp_path / "final.pt"
    os.mkfifo(fifo)
    args = {"rltrain.cli.evaluate": [str(fifo)], "rltrain.cli.export": [str(fifo), "--out", str(tmp_path / "p.pt2")],
            "rltrain": ["debug=smoke", "logger=quiet", f"resume={fifo}", f"hydra.run.dir={tmp_path / 'r'}"]}[tool]
    res = _tool(tool, *args, cwd=tmp_path)  # a read would block forever: the 120 s bound fails it
    assert res.returncode == 2, res.stderr[-3000:]
    lines = _errors(res)
    assert len(lines) == 1 and f"{fifo}: a FIFO, not a regular file" in lines[0], res.stderr[-3000:]


def test_export_never_writes_over_a_runs_files(trained, tmp_path):
    run_dir = shutil.copytree(trained, tmp_path / "run", ignore=shutil.ignore_patterns(".rltrain.lock"))
    final = run_dir / "checkpoints" / "final.pt"
    before = final.read_bytes()
    for out in (final, run_dir / "summary.pt"):  # the checkpoint itself; a description over summary.json
        res = _tool("rltrain.cli.export", str(run_dir), "--out", str(out), "--force", cwd=tmp_path)
        assert res.returncode == 2 and len(_errors(res)) == 1, res.stderr[-3000:]
        assert "no tool writes over a run's files" in res.stderr
    assert final.read_bytes() == before and _summary(run_dir)["status"] == "completed"
