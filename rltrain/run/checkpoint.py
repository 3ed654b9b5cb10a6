"""Checkpoints: atomic writes, keep-last-N / best / final, full-state resume, and what a resume may trust.

A checkpoint is a plain dict of tensors and Python containers (RNG states included as plain dicts), so it
loads with ``torch.load(weights_only=True)``. Environments cannot go into that format, so a sidecar
``<name>.envs.pkl`` holds the pickled envs when they pickle; with it, resume continues the very same
trajectories, without it the envs restart from fresh episodes (documented: then resume is exact only in
the learner state).

Unpickling runs code, so the sidecar is only unpickled when this user's own runs wrote it: a random per-user
key (``sidecar.key``, mode 0600, in ``$RLTRAIN_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/rltrain``, else
``~/.config/rltrain``; created at the first checkpoint) signs it, and every checkpoint stores the HMAC-SHA256
of its sidecar's bytes (``envs_mac``). The key never lives in the data it authenticates: a run dir copied from
someone else (whatever key file it carries), a crafted file or a truncated write does not verify and is
skipped with one warning, unless the user opts in explicitly (``resume_trust_envs=true``).

Commit order (a crash at any point leaves a consistent set): sidecar temp + checkpoint temp are written and
fsynced, then the sidecar is renamed, then the checkpoint. A sidecar without its checkpoint is swept at start.
"""

from __future__ import annotations

import contextlib
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
from rltrain.run.resume_rules import upgrade_config
from rltrain.run.trust import first_non_finite, not_regular

_STEP_RE = re.compile(r"^step_(\d+)\.pt$")
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
            try:
                write(f)
            except RuntimeError as err:  # torch.save's zip writer turns a failed write into its own error
                raise _writer_failure(err, path, f) from err
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        if err.filename:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from err  # name the file in the one-line report


def _writer_failure(err: RuntimeError, path: Path, f) -> OSError:
    """The OSError a failed ``torch.save`` stands for: ENOSPC on a full disk, EFBIG past the file-size limit,
    else EIO with the writer's own first line (``PytorchStreamWriter failed writing file ...``)."""
    import resource

    try:
        written = f.tell()
        free = os.statvfs(path.parent)
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    except (OSError, ValueError):
        written, free, soft = 0, None, resource.RLIM_INFINITY
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    if free is not None and free.f_bavail * free.f_frsize < (1 << 20):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    if soft != resource.RLIM_INFINITY and written >= soft - 4096:
        return OSError(errno.EFBIG, f"{os.strerror(errno.EFBIG)} (the file-size limit, ulimit -f)", str(path))
    return OSError(errno.EIO, f"the checkpoint writer failed ({detail})", str(path))


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


KEY_ENV = "RLTRAIN_CONFIG_DIR"  # where the per-user key lives (tests point it at a temp dir)


def key_path() -> Path:
    """The per-user key file: outside every run dir, so no run dir can vouch for itself."""
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV]) / "sidecar.key"
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "rltrain" / "sidecar.key"


def user_key(*, create: bool) -> bytes | None:
    """This user's secret MAC key; created (0600, in a 0700 dir) when ``create`` and there is none, else None.
    A key that cannot be created (a read-only home) is None with one warning: sidecars are then not written."""
    path = key_path()
    try:
        key = path.read_bytes()
    except OSError:
        key = b""
    if len(key) == KEY_BYTES:
        return key
    if not create:
        return None
    tmp = _tmp_name(path)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        if len(key):  # cut short by a kill: no MAC was made with it
            os.replace(tmp, path)
        else:
            with contextlib.suppress(FileExistsError):  # two runs creating it at once: the first link wins
                os.link(tmp, path)
        key = path.read_bytes()
    except OSError as err:
        warn(f"cannot create the key that signs env sidecars ({path}: {err.strerror or err}); checkpoints are "
             f"written without their envs sidecar (set {KEY_ENV} to a writable dir)")
        return None
    finally:
        tmp.unlink(missing_ok=True)
    return key if len(key) == KEY_BYTES else None


def envs_mac(key: bytes, blob: bytes) -> str:
    return hmac.new(key, blob, hashlib.sha256).hexdigest()


def sweep_temp_files(run_dir: Path) -> list[Path]:
    """Remove what an interrupted write left: temp files and sidecars whose checkpoint never landed.

    Only the run dir's owner calls this (it holds the run-dir lock), so no temp file here is in use.
    """
    run_dir = Path(run_dir)
    ckdir = run_dir / "checkpoints"
    # only the temp names rltrain itself makes (``_tmp_name``, summary.json's, metrics.csv's rewrite): a user's
    # own ``notes.tmp`` in a reused dir is not ours to delete
    found = [p for p in run_dir.iterdir() if _OWN_TEMP.match(p.name) and _regular(p)] if run_dir.is_dir() else []
    if ckdir.is_dir():
        found += [p for p in ckdir.iterdir() if _OWN_CHECKPOINT_TEMP.match(p.name) and _regular(p)]
        found += [p for p in ckdir.glob("*.envs.pkl")
                  if _CHECKPOINT.match(p.name[: -len(".envs.pkl")] + ".pt") and _regular(p)
                  and not p.with_name(p.name[: -len(".envs.pkl")] + ".pt").exists()]
    for p in found:
        p.unlink(missing_ok=True)
    return found


_CHECKPOINT = re.compile(r"^(step_\d{12}|best|final)\.pt$")
# (``..rltrain-key.tmp<pid>``: the key's temp file of versions that kept the key in the run dir)
_OWN_TEMP = re.compile(r"^(\.summary\.json\.tmp\d+|metrics\.csv\.tmp|\.\.rltrain-key\.tmp\d+)$")
_OWN_CHECKPOINT_TEMP = re.compile(r"^\.(step_\d{12}|best|final)\.(pt|envs\.pkl)\.tmp\d+$")


def _regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


class CheckpointManager:
    """Writes ``checkpoints/step_<env_steps>.pt`` (keeps the last N), ``best.pt`` and ``final.pt``."""

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
        key = user_key(create=True) if envs is not None else None
        envs = envs if key is not None else None  # an unsigned sidecar could never be loaded
        try:
            if envs is not None:
                state = {**state, "envs_mac": envs_mac(key, envs)}
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
            kind = not_regular(p)
            if kind:  # never opened: a FIFO would block the read
                corrupt.append(f"{p.name} ({kind})")
                continue
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


def no_checkpoint_in(directory: Path, *, key: str | None = None) -> ConfigError:
    """The one line for a directory that holds no checkpoint (``key``: the setting or flag that named it), for
    every tool. A trainer=parallel run or a multirun sweep dir has its runs one level down: the line names them."""
    runs = sorted(d.name for d in directory.iterdir() if (d / "checkpoints").is_dir())
    below = (f" (its runs {', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''} have theirs: pass one, "
             f"e.g. {directory / runs[0]})") if runs else ""
    return ConfigError(f"{f'{key}=' if key else ''}{directory}: no checkpoint found in that directory{below}")


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
            raise no_checkpoint_in(path, key=key)
        path = found
    if not path.exists():
        raise ConfigError(f"{key}={path}: no such file or directory")
    kind = not_regular(path)
    if kind:  # a FIFO would block the read forever, a device read without end
        raise ConfigError(f"{key}={path}: {kind}, not a regular file: not a checkpoint")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:
        raise ConfigError(f"{key}={path}: not an rltrain checkpoint ({type(err).__name__})") from None
    if not isinstance(state, dict) or "algo" not in state or "counters" not in state:
        raise ConfigError(f"{key}={path}: not an rltrain checkpoint (missing 'algo'/'counters')")
    bad = first_non_finite(state["algo"], "algo")
    if bad:  # rltrain never writes one (the non-finite guard checks before every save): an altered file
        raise ConfigError(f"{key}={path}: its weights are not finite: {bad}; a checkpoint rltrain writes never "
                          "holds one (this file was altered or written by other code): use another checkpoint")
    if isinstance(state.get("meta"), dict) and isinstance(state["meta"].get("config"), dict):
        upgrade_config(state["meta"]["config"])
    sidecar = path.with_suffix(".envs.pkl")
    if (run_dir is None and not trust_envs) or not sidecar.exists():
        return state, None
    return state, _trusted_sidecar(sidecar, state.get("envs_mac"), run_dir, trust_envs)


def _trusted_sidecar(sidecar: Path, mac: object, run_dir: Path | None, trust_envs: bool) -> bytes | None:
    blob = sidecar.read_bytes()
    key = user_key(create=False) if run_dir is not None else None
    if key is not None and isinstance(mac, str) and hmac.compare_digest(mac, envs_mac(key, blob)):
        return blob
    if not trust_envs:
        warn(f"not loading {sidecar}: its MAC does not verify under your key {key_path()} (a run dir copied from "
             f"someone else, an altered or truncated file) and unpickling runs code; the envs restart from fresh "
             f"episodes ({TRUST_KEY}=true loads it anyway: only for files you trust)")
        return None
    try:
        pickle.loads(blob)  # the user vouched for it; a truncated one must still not leave the envs half-restored
    except Exception as err:
        warn(f"not loading {sidecar}: it does not unpickle ({type(err).__name__}); the envs restart fresh")
        return None
    return blob
