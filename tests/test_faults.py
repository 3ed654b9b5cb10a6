"""Trust and failure in the run dir (design section 6), each provoked with real runs, files and processes.

Attacks replay what an adversarial user did: a crafted env sidecar beside a checkpoint, a checkpoint whose
config names ``os:system`` for ``rltrain-eval``. Each asserts a marker file is never created. Faults: two runs
in one dir, truncated checkpoints and sidecars, a full disk while checkpointing, temp files left by a kill.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rltrain.run.checkpoint import key_path, user_key
from rltrain.run.lock import RunDirLock, owns_run
from rltrain.run.summary import write_summary
from tests.conftest import REPO, run_cli

SMOKE = ["debug=smoke", "logger=quiet"]


def _train(run_dir: Path, *extra: str, module: str = "rltrain", env: dict | None = None):
    return run_cli([*SMOKE, f"hydra.run.dir={run_dir}", *extra], cwd=run_dir.parent, timeout=120,
                   module=module, env={"PYTHONPATH": _pythonpath(), **(env or {})})


def _pythonpath() -> str:
    """The checkout first (``tests.helpers`` must import in the subprocess), then what was there."""
    return os.pathsep.join(p for p in [str(REPO), *os.environ.get("PYTHONPATH", "").split(os.pathsep)] if p)


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _stderr_lines(res) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.strip()]


def _temp_files(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if ".tmp" in p.name)


class _Touch:
    """Unpickling this creates ``path``: stands for any command a crafted pickle could run."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One finished smoke run (2048 steps: step_1024, step_2048, best, final, each with its sidecar)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    res = _train(run_dir)
    assert res.returncode == 0, res.stderr
    return run_dir


def _copy_run(trained: Path, dest: Path) -> Path:
    shutil.copytree(trained, dest, ignore=shutil.ignore_patterns(".rltrain.lock"))
    return dest


# -- 1. trust: nothing is unpickled or imported that the user did not ask for ----------------------------------
@pytest.mark.parametrize("how", ["copied-file", "same-dir-auto"])
def test_crafted_sidecar_is_never_unpickled(trained, tmp_path, how):
    marker = tmp_path / "pwned"
    crafted = pickle.dumps(_Touch(marker))
    if how == "copied-file":  # a real checkpoint copied elsewhere, a crafted sidecar beside it
        src = tmp_path / "download" / "step_000000001024.pt"
        src.parent.mkdir()
        shutil.copy(trained / "checkpoints" / "step_000000001024.pt", src)
        src.with_suffix(".envs.pkl").write_bytes(crafted)
        run_dir, resume = tmp_path / "run", f"resume={src}"
    else:  # the sidecar of this very run dir's latest checkpoint replaced
        run_dir, resume = _copy_run(trained, tmp_path / "run"), "resume=auto"
        for p in (run_dir / "checkpoints").glob("*.envs.pkl"):
            p.write_bytes(crafted)
    res = _train(run_dir, "total_env_steps=3072", resume)
    assert not marker.exists()
    assert res.returncode == 0, res.stderr
    warnings = [ln for ln in _stderr_lines(res) if "warning" in ln]
    assert len(warnings) == 1 and "MAC does not verify" in warnings[0] and "resume_trust_envs=true" in warnings[0]
    assert _summary(run_dir)["status"] == "completed"
    assert _summary(run_dir)["total_env_steps"] == 3072


def test_own_sidecar_loads_silently(trained, tmp_path):
    key = key_path()  # per user, outside every run dir
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    assert not list(trained.glob("*key*"))  # nothing in the run dir vouches for its own files
    own = _copy_run(trained, tmp_path / "own")
    res = _train(own, "total_env_steps=3072", "resume=auto")
    assert res.returncode == 0 and "warning" not in res.stderr, res.stderr


def test_foreign_sidecar_is_skipped_unless_the_user_opts_in(trained, tmp_path):
    """A run dir copied from someone else (another user's key signed it): one warning saying how to opt in."""
    other_user = {"RLTRAIN_CONFIG_DIR": str(tmp_path / "other-user")}
    copied = _copy_run(trained, tmp_path / "copied")
    res = _train(copied, "total_env_steps=3072", "resume=auto", env=other_user)
    assert res.returncode == 0 and "MAC does not verify" in res.stderr and "resume_trust_envs=true" in res.stderr
    assert len([ln for ln in _stderr_lines(res) if "warning" in ln]) == 1, res.stderr
    ckpt = trained / "checkpoints" / "step_000000002048.pt"
    res = _train(tmp_path / "trusting", "total_env_steps=3072", f"resume={ckpt}", "resume_trust_envs=true",
                 env=other_user)
    assert res.returncode == 0 and "warning" not in res.stderr, res.stderr


def test_a_key_file_inside_a_copied_run_dir_vouches_for_nothing(trained, tmp_path):
    """The old self-vouching attack: a crafted sidecar signed with a key the run dir itself carries."""
    import hashlib
    import hmac

    marker = tmp_path / "pwned"
    run_dir = _copy_run(trained, tmp_path / "run")
    key = b"k" * 32
    (run_dir / ".rltrain-key").write_bytes(key)
    crafted = pickle.dumps(_Touch(marker))
    for pt in (run_dir / "checkpoints").glob("*.pt"):
        state = torch.load(pt, weights_only=True)
        state["envs_mac"] = hmac.new(key, crafted, hashlib.sha256).hexdigest()
        torch.save(state, pt)
        pt.with_suffix(".envs.pkl").write_bytes(crafted)
    res = _train(run_dir, "total_env_steps=3072", "resume=auto")
    assert not marker.exists()
    assert res.returncode == 0 and "MAC does not verify" in res.stderr, res.stderr


def _eval(target: Path, *flags: str):
    return subprocess.run([sys.executable, "-m", "rltrain.cli.evaluate", str(target), "--episodes", "1", *flags],
                          capture_output=True, text=True, timeout=120, cwd=target.parent)


def _crafted_checkpoint(trained: Path, dest: Path, *, env: dict | None = None, algo: str | None = None) -> Path:
    state = torch.load(trained / "checkpoints" / "final.pt", weights_only=True)
    state["meta"]["config"]["env"].update(env or {})
    if algo:
        state["meta"]["config"]["algo"]["_target_"] = algo
    torch.save(state, dest)
    return dest


def test_eval_never_imports_a_module_named_in_the_checkpoint(trained, tmp_path):
    marker = tmp_path / "pwned"
    crafted = _crafted_checkpoint(trained, tmp_path / "crafted.pt",
                                  env={"id": "os:system", "kwargs": {"command": f"touch {marker}"}})
    res = _eval(crafted)
    assert not marker.exists()
    assert res.returncode == 2 and _stderr_lines(res) == [res.stderr.strip()], res.stderr
    assert "env.id=os:system" in res.stderr and "--allow-import" in res.stderr
    # the flag is what gates it: with it the module is imported (and os.system returns no env)
    res = _eval(crafted, "--allow-import")
    assert marker.exists() and res.returncode == 2 and "not a gymnasium.Env" in res.stderr


def test_eval_refuses_a_non_algorithm_target_and_runs_registered_ids(trained, tmp_path):
    # a checkpoint naming a function instead of an rltrain algorithm is refused before anything is called
    crafted = _crafted_checkpoint(trained, tmp_path / "crafted.pt", algo="rltrain.trainers.rendezvous.first_host")
    res = _eval(crafted)
    assert res.returncode == 2 and "not an rltrain algorithm" in res.stderr, res.stderr
    # a registered Gymnasium id needs no flag
    res = _eval(trained / "checkpoints" / "final.pt")
    assert res.returncode == 0 and "mean return" in res.stdout, res.stderr


# -- 2. summary.json is always valid JSON ---------------------------------------------------------------------
def test_summary_json_has_no_nan_and_no_leftover_temp(tmp_path):
    write_summary(tmp_path, {"a": math.nan, "b": [math.inf, 1.5], "c": np.float32("nan"), "d": np.int64(3),
                             "e": torch.tensor(-math.inf), "f": None, "g": "x"})

    def refuse(token):
        raise AssertionError(f"not JSON: {token}")

    data = json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)
    assert data == {"a": None, "b": [None, 1.5], "c": None, "d": 3, "e": None, "f": None, "g": "x"}
    blocked = tmp_path / "blocked"
    (blocked / "summary.json").mkdir(parents=True)  # the rename fails: the temp file must not stay
    with pytest.raises(OSError):
        write_summary(blocked, {"status": "completed"})
    assert sorted(p.name for p in blocked.iterdir()) == ["summary.json"]


# -- 3. one owner per run dir ---------------------------------------------------------------------------------
def test_second_run_in_a_live_run_dir_refuses_and_sigkill_frees_it(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    env.pop("HYDRA_FULL_ERROR", None)
    first = subprocess.Popen([sys.executable, "-m", "rltrain", *SMOKE, f"hydra.run.dir={run_dir}",
                              "total_env_steps=100000000"], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        lock = run_dir / ".rltrain.lock"
        while not (lock.exists() and lock.read_text().strip() == str(first.pid)):
            assert time.monotonic() < deadline and first.poll() is None, "first run did not take the lock"
            time.sleep(0.1)
        res = _train(run_dir, "total_env_steps=2048")
        assert res.returncode == 2, res.stderr
        assert _stderr_lines(res) == [f"rltrain: error: hydra.run.dir={run_dir}: another rltrain run "
                                      f"(pid {first.pid}) is using this run dir; wait for it to end or stop it, "
                                      "or pick another hydra.run.dir"]
        # the refused run wrote nothing over the live one (which says running, once it got that far)
        if (run_dir / "summary.json").exists():
            assert _summary(run_dir)["status"] == "running" and _summary(run_dir)["pid"] == first.pid
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    # the kernel dropped the dead owner's lock (a SLURM requeue finds the dir free); the stale pid is no obstacle
    with RunDirLock(run_dir):
        assert (run_dir / ".rltrain.lock").read_text().strip() == str(os.getpid())


def test_only_the_owning_process_of_a_launch_takes_the_lock():
    assert owns_run({})
    assert owns_run({"RANK": "0", "WORLD_SIZE": "2"}) and not owns_run({"RANK": "1", "WORLD_SIZE": "2"})
    assert owns_run({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"})
    assert not owns_run({"SLURM_PROCID": "3", "SLURM_NTASKS": "4"})
    assert owns_run({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})  # one task spawns its own ranks


# -- 4. no silent loss ----------------------------------------------------------------------------------------
def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def test_truncated_latest_checkpoints_are_skipped_out_loud(trained, tmp_path):
    run_dir = _copy_run(trained, tmp_path / "run")
    latest = sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt")
                    if torch.load(p, weights_only=True)["counters"]["env_steps"] == 2048)
    assert "final.pt" in latest and "step_000000002048.pt" in latest
    for name in latest:
        _truncate(run_dir / "checkpoints" / name)
    res = _train(run_dir, "total_env_steps=3072", "resume=auto")
    assert res.returncode == 0, res.stderr
    warnings = [ln for ln in _stderr_lines(res) if "warning" in ln]
    assert len(warnings) == 1 and all(name in warnings[0] for name in latest), res.stderr
    assert "using step_000000001024.pt" in warnings[0]
    assert _summary(run_dir)["resumed_from_env_steps"] == 1024


def test_all_checkpoints_truncated_refuses_and_leaves_the_run_untouched(trained, tmp_path):
    run_dir = _copy_run(trained, tmp_path / "run")
    for p in (run_dir / "checkpoints").glob("*.pt"):
        _truncate(p)
    before = {name: (run_dir / name).read_bytes() for name in ("metrics.csv", "summary.json")}
    res = _train(run_dir, "total_env_steps=3072", "resume=auto")
    assert res.returncode == 2
    assert len(_stderr_lines(res)) == 1 and "refusing to restart over this run" in res.stderr, res.stderr
    assert {name: (run_dir / name).read_bytes() for name in before} == before


def test_truncated_sidecar_is_skipped_with_one_warning(trained, tmp_path):
    run_dir = _copy_run(trained, tmp_path / "run")
    for p in (run_dir / "checkpoints").glob("*.envs.pkl"):
        _truncate(p)
    res = _train(run_dir, "total_env_steps=3072", "resume=auto")
    assert res.returncode == 0, res.stderr
    warnings = [ln for ln in _stderr_lines(res) if "warning" in ln]
    assert len(warnings) == 1 and "envs.pkl: its MAC does not verify" in warnings[0]
    assert "fresh episodes" in warnings[0]
    # opting in does not help a truncated pickle: still one warning, still no traceback
    run_dir = _copy_run(trained, tmp_path / "trusting")
    for p in (run_dir / "checkpoints").glob("*.envs.pkl"):
        _truncate(p)
    res = _train(run_dir, "total_env_steps=3072", "resume=auto", "resume_trust_envs=true")
    assert res.returncode == 0, res.stderr
    warnings = [ln for ln in _stderr_lines(res) if "warning" in ln]
    assert len(warnings) == 1 and "does not unpickle" in warnings[0], res.stderr


def test_full_disk_while_checkpointing_fails_in_one_line_and_keeps_earlier_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    # the first periodic checkpoint (1024) lands, the second (2048) hits a full disk
    res = _train(run_dir, module="tests.helpers.full_disk",
                 env={"RLTRAIN_FULL_DISK": ".step_*.pt.tmp*", "RLTRAIN_FULL_DISK_AFTER": "1"})
    assert res.returncode == 2
    assert _stderr_lines(res) == [res.stderr.strip()] and "No space left on device" in res.stderr, res.stderr
    assert "step_000000002048.pt" in res.stderr and "resume=auto" in res.stderr
    summary = _summary(run_dir)
    assert summary["status"] == "failed" and "No space left" in summary["error"]
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert "step_000000001024.pt" in ckpts and "step_000000001024.envs.pkl" in ckpts
    assert not any(n.startswith("step_000000002048") for n in ckpts), ckpts  # no orphan sidecar either
    assert _temp_files(run_dir) == []
    # space again: the run resumes from the intact checkpoint
    res = _train(run_dir, "resume=auto")
    assert res.returncode == 0 and _summary(run_dir)["resumed_from_env_steps"] == 1024, res.stderr


def test_disk_full_for_every_write_still_one_line_and_no_temp_files(tmp_path):
    run_dir = tmp_path / "run"
    user_key(create=True)  # the per-user key exists already (it is not in the run dir)
    res = _train(run_dir, module="tests.helpers.full_disk",
                 # the `running` summary, then at 1024 steps best.pt (sidecar, checkpoint), step_1024 (same)
                 # land; then the disk is full
                 env={"RLTRAIN_FULL_DISK": ".*.tmp*", "RLTRAIN_FULL_DISK_AFTER": "5"})
    assert res.returncode == 2
    assert _stderr_lines(res) == [res.stderr.strip()] and "No space left on device" in res.stderr, res.stderr
    # the final summary could not be written; no empty or partial one either: it still says running (the next
    # start records the run as crashed)
    assert _summary(run_dir)["status"] == "running"
    assert _temp_files(run_dir) == []
    assert (run_dir / "checkpoints" / "step_000000001024.pt").exists()


def test_leftover_temp_files_and_orphan_sidecars_are_swept_at_start(trained, tmp_path):
    run_dir = _copy_run(trained, tmp_path / "run")
    ck = run_dir / "checkpoints"
    (ck / f".step_000000003072.pt.tmp{os.getpid()}").write_bytes(b"partial")
    (ck / f".step_000000003072.envs.pkl.tmp{os.getpid()}").write_bytes(b"partial")
    (ck / "step_000000009216.envs.pkl").write_bytes(b"an orphan: its .pt never landed")
    (run_dir / ".summary.json.tmp123").write_bytes(b"")
    (run_dir / "..rltrain-key.tmp123").write_bytes(b"\0" * 7)
    res = _train(run_dir, "total_env_steps=3072", "resume=auto")
    assert res.returncode == 0, res.stderr
    assert _temp_files(run_dir) == []
    assert not (ck / "step_000000009216.envs.pkl").exists()
    assert (ck / "step_000000003072.pt").exists() and (ck / "step_000000003072.envs.pkl").exists()
    assert _summary(run_dir)["resumed_from_env_steps"] == 2048
