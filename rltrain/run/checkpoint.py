"""Checkpoints: atomic writes, keep-last-N / best / final, full-state resume, and what a resume may trust.

A checkpoint is a plain dict of tensors and Python containers (RNG states included as plain dicts), so it
loads with ``torch.load(weights_only=True)``. Environments cannot go into that format, so a sidecar
``<name>.envs.pkl`` holds the pickled envs when they pickle; with it, resume continues the very same
trajectories, without it the envs restart from fresh episodes (documented: then resume is exact only in
the learner state).

Unpickling runs code, so the sidecar is only unpickled when this run dir's own run wrote it: the run dir
holds a random key (``.rltrain-key``, mode 0600, created at the first checkpoint) and every checkpoint stores
the HMAC-SHA256 of its sidecar's bytes (``envs_mac``). A sidecar whose MAC does not verify under the key of the
run dir that resumes (a copied checkpoint, a crafted file, a truncated write) is skipped with one warning,
unless the user opts in explicitly (``resume_trust_envs=true``).

Commit order (a crash at any point leaves a consistent set): sidecar temp + checkpoint temp are written and
fsynced, then the sidecar is renamed, then the checkpoint. A sidecar without its checkpoint is swept at start.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import pickle
import re
import secrets
import sys
from pathlib import Path

import torch

from rltrain.errors import ConfigError

_STEP_RE = re.compile(r"^step_(\d+)\.pt$")
KEY_FILE = ".rltrain-key"
KEY_BYTES = 32
TRUST_KEY = "resume_trust_envs"  # the config key that opts in to unpickling an unverified sidecar


def warn(message: str) -> None:
    """One warning line on stderr (the run goes on)."""
    print(f"rltrain: warning: {message}", file=sys.stderr, flush=True)


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def _write_synced(path: Path, write) -> None:
    """``write(file)``, flush and fsync: a full disk surfaces here (delayed allocation reports at fsync)."""
    try:
        with open(path, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        if err.filename:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from err  # name the file in the one-line report


_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG, errno.EIO}


def disk_write_failure(err: BaseException, run_dir: Path) -> str | None:
    """One line for a full disk or an unwritable run dir, naming the first write that failed (a later one,
    e.g. summary.json on the same full disk, carries the first in its context); None for other errors."""
    chain, seen = [], err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _WRITE_ERRNOS:
            chain.append(seen)
        seen = seen.__context__
    if not chain:
        return None
    # the earliest failure that names its file (an fsync error is re-raised with the name)
    first = next((e for e in reversed(chain) if e.filename), chain[-1])
    where = f" {first.filename}" if first.filename else ""
    return (f"hydra.run.dir={run_dir}: cannot write{where}: {first.strerror or first}; free disk space or make "
            "the run dir writable, then rerun with resume=auto (earlier checkpoints are intact)")


def _sync_dir(directory: Path) -> None:
    """fsync the directory so the renames themselves survive a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP):  # file systems that cannot sync a directory
            raise
    finally:
        os.close(fd)


def atomic_save(obj: dict, path: Path) -> None:
    """torch.save to a temp file in the same dir, fsync, then rename: a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    try:
        _write_synced(tmp, lambda f: torch.save(obj, f))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(data: bytes, path: Path) -> None:
    tmp = _tmp_name(path)
    try:
        _write_synced(tmp, lambda f: f.write(data))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def run_key(run_dir: Path, *, create: bool) -> bytes | None:
    """The run dir's secret MAC key; created (0600) when ``create`` and there is no valid one, else None.

    Only the run dir's owner (it holds the run-dir lock) creates it, so two writers never race here.
    """
    path = Path(run_dir) / KEY_FILE
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = b""
    if len(key) == KEY_BYTES:
        return key
    if not create:
        return None
    key = secrets.token_bytes(KEY_BYTES)  # also replaces one cut short by a kill: no MAC was made with it
    tmp = _tmp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, key)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return key


def envs_mac(key: bytes, blob: bytes) -> str:
    return hmac.new(key, blob, hashlib.sha256).hexdigest()


def sweep_temp_files(run_dir: Path) -> list[Path]:
    """Remove what an interrupted write left: temp files and sidecars whose checkpoint never landed.

    Only the run dir's owner calls this (it holds the run-dir lock), so no temp file here is in use.
    """
    run_dir = Path(run_dir)
    ckdir = run_dir / "checkpoints"
    found = [p for p in run_dir.glob(".*.tmp*") if p.is_file()]  # summary.json's, the key's
    if ckdir.is_dir():
        found += [p for p in ckdir.glob(".*.tmp*") if p.is_file()]
        found += [p for p in ckdir.glob("*.envs.pkl") if not p.with_name(p.name[: -len(".envs.pkl")] + ".pt").exists()]
    for p in found:
        p.unlink(missing_ok=True)
    return found


class CheckpointManager:
    """Writes ``checkpoints/step_<env_steps>.pt`` (keeps the last N), ``best.pt`` and ``final.pt``.

    The MAC key lives in the run dir, the parent of ``directory``.
    """

    def __init__(self, directory: Path, *, keep_last: int = 3):
        self.dir = Path(directory)
        self.keep_last = keep_last

    @property
    def run_dir(self) -> Path:
        return self.dir.parent

    def save(self, state: dict, env_steps: int, *, envs: bytes | None = None, kind: str = "step") -> Path:
        name = f"step_{env_steps:012d}.pt" if kind == "step" else f"{kind}.pt"
        path = self.dir / name
        sidecar = path.with_suffix(".envs.pkl")
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp_pt, tmp_envs = _tmp_name(path), _tmp_name(sidecar)
        try:
            if envs is not None:
                state = {**state, "envs_mac": envs_mac(run_key(self.run_dir, create=True), envs)}
                _write_synced(tmp_envs, lambda f: f.write(envs))
            _write_synced(tmp_pt, lambda f: torch.save(state, f))
            if envs is not None:
                os.replace(tmp_envs, sidecar)
            else:  # an older sidecar of best.pt / final.pt must not pair with the new checkpoint
                sidecar.unlink(missing_ok=True)
            os.replace(tmp_pt, path)
            _sync_dir(self.dir)
        finally:
            tmp_pt.unlink(missing_ok=True)
            tmp_envs.unlink(missing_ok=True)
        if kind == "step":
            self._prune()
        return path

    def _prune(self) -> None:
        steps = sorted(p for p in self.dir.glob("step_*.pt") if _STEP_RE.match(p.name))
        for old in steps[: max(len(steps) - self.keep_last, 0)]:
            old.unlink(missing_ok=True)
            old.with_suffix(".envs.pkl").unlink(missing_ok=True)

    def latest(self, *, refuse_if_all_corrupt: bool = False) -> Path | None:
        """The loadable checkpoint with the most env steps (step_*, final or best), or None.

        Checkpoints that do not load (truncated, corrupt) are skipped with one warning naming them. With
        ``refuse_if_all_corrupt``, checkpoints that exist but none loads raise ConfigError instead: restarting
        from step 0 would overwrite the run's metrics.
        """
        best_path, best_steps = None, -1
        corrupt: list[str] = []
        for p in sorted(self.dir.glob("*.pt")):
            try:
                steps = int(torch.load(p, weights_only=True, map_location="cpu", mmap=True)["counters"]["env_steps"])
            except Exception:
                corrupt.append(p.name)
                continue
            # prefer step/final over best at equal steps: they are written after the best
            if steps > best_steps or (steps == best_steps and p.name != "best.pt"):
                best_path, best_steps = p, steps
        if corrupt and best_path is None and refuse_if_all_corrupt:
            raise ConfigError(f"resume=auto: no checkpoint in {self.dir} loads ({', '.join(corrupt)}: truncated or "
                              "corrupt); refusing to restart over this run: move them away and use resume=never, "
                              "or resume=<a good checkpoint file>")
        if corrupt:
            using = f"; using {best_path.name}" if best_path else ""
            warn(f"skipping checkpoints in {self.dir} that do not load (truncated or corrupt): "
                 f"{', '.join(corrupt)}{using}")
        return best_path


def load_checkpoint(path: Path, *, key: str = "resume", run_dir: Path | None = None,
                    trust_envs: bool = False) -> tuple[dict, bytes | None]:
    """Load a checkpoint file (or the latest in a run dir / checkpoints dir) and, if it may, its env sidecar.

    The sidecar bytes come back only when they verify under ``run_dir``'s key, or when ``trust_envs`` (the
    user's explicit opt-in) and they unpickle. Without ``run_dir`` and ``trust_envs`` it is never read.
    """
    path = Path(path)
    if path.is_dir():
        found = CheckpointManager(path / "checkpoints" if (path / "checkpoints").is_dir() else path).latest()
        if found is None:
            raise ConfigError(f"{key}={path}: no checkpoint found in that directory")
        path = found
    if not path.exists():
        raise ConfigError(f"{key}={path}: no such file or directory")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:
        raise ConfigError(f"{key}={path}: not an rltrain checkpoint ({type(err).__name__})") from None
    if not isinstance(state, dict) or "algo" not in state or "counters" not in state:
        raise ConfigError(f"{key}={path}: not an rltrain checkpoint (missing 'algo'/'counters')")
    sidecar = path.with_suffix(".envs.pkl")
    if (run_dir is None and not trust_envs) or not sidecar.exists():
        return state, None
    return state, _trusted_sidecar(sidecar, state.get("envs_mac"), run_dir, trust_envs)


def _trusted_sidecar(sidecar: Path, mac: object, run_dir: Path | None, trust_envs: bool) -> bytes | None:
    blob = sidecar.read_bytes()
    key = run_key(run_dir, create=False) if run_dir is not None else None
    if key is not None and isinstance(mac, str) and hmac.compare_digest(mac, envs_mac(key, blob)):
        return blob
    if not trust_envs:
        warn(f"not loading {sidecar}: its MAC does not verify under this run dir's key (another run dir's file, "
             f"altered or truncated) and unpickling runs code; the envs restart from fresh episodes "
             f"({TRUST_KEY}=true loads it anyway: only for files you trust)")
        return None
    try:
        pickle.loads(blob)  # the user vouched for it; a truncated one must still not leave the envs half-restored
    except Exception as err:
        warn(f"not loading {sidecar}: it does not unpickle ({type(err).__name__}); the envs restart fresh")
        return None
    return blob


# What must match for a checkpoint to continue this run, in the order a user thinks of it: the algorithm, the
# env (its observations and actions shape the networks), then the network itself. (label, config path)
_RESUME_KEYS = (("algorithm", ("algo", "_target_")), ("env", ("env", "id")), ("env wrappers", ("env", "wrappers")),
                ("architecture", ("algo", "hidden_sizes")), ("architecture", ("algo", "activation")),
                ("architecture", ("algo", "frame_stack")), ("architecture", ("algo", "norm_obs")))


_ABSENT = object()


def _at(config: dict, keys: tuple[str, ...]):
    for key in keys:
        if not isinstance(config, dict) or key not in config:
            return _ABSENT
        config = config[key]
    return config


def resume_mismatch(path: Path, saved: dict, current: dict) -> str | None:
    """One line naming what differs between a checkpoint's config (``meta.config``) and this run's, else None.

    Loading another run's weights fails deep inside ``load_state_dict`` (``size mismatch``, ``KeyError``);
    comparing the recorded configs first names the difference and the fix."""
    models = [m for m in (_at(saved, ("model",)), _at(current, ("model",))) if isinstance(m, dict)]
    # the model group's _target_ names where ModelSettings lives (it moved), not an architecture
    model_keys = sorted(set().union(*models) - {"_target_"})
    for label, keys in (*_RESUME_KEYS, *(("architecture", ("model", k)) for k in model_keys)):
        was, now = _at(saved, keys), _at(current, keys)
        if was != now and was is not _ABSENT:  # a checkpoint older than a key cannot be compared on it
            key = ".".join(keys)
            now = None if now is _ABSENT else now
            return (f"resume={path}: the checkpoint is of another {label} ({key}={was!r} in it, {now!r} in this "
                    f"run); resume with the same {key}, or start a fresh run in another hydra.run.dir")
    return None
