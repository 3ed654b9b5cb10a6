"""Checkpoint -> policy for the tools (``rltrain-eval``, ``rltrain-export``, ``rltrain.load_policy``).

A checkpoint's config comes from whoever wrote the file: nothing named inside it is imported without the
user's ``--allow-import``, and no wrapper stored in it chooses where the tools write files.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rltrain.cli.build import algo_factory, env_factory, resolve_target
from rltrain.errors import ConfigError
from rltrain.run.device import pick_device


def load_policy(path: Path, *, device: str = "cpu", allow_import: bool = False):
    """For ``rltrain-eval``: (policy, config, checkpoint path, eval seed) from a checkpoint or run dir.

    The config comes from inside the checkpoint, i.e. from whoever wrote the file: it may name a registered
    Gymnasium id and an rltrain algorithm class, nothing else, unless ``allow_import`` (the user's
    ``--allow-import``) lets an ``env.id`` import path ``module:Attr`` import and call its module.
    """
    from rltrain.run.checkpoint import CheckpointManager, load_checkpoint

    path = Path(path)
    if path.is_dir():
        ckdir = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        path = ckdir / "final.pt" if (ckdir / "final.pt").exists() else (CheckpointManager(ckdir).latest() or ckdir)
    state, _ = load_checkpoint(path, key="checkpoint")  # no run dir: its envs sidecar is never unpickled
    try:
        return _policy_from(state, path, device=device, allow_import=allow_import)
    except ConfigError as err:  # a setting inside the file: say which file
        if str(path) in str(err):
            raise
        raise ConfigError(f"checkpoint={path}: inside it, {err}") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as err:
        # a crafted or foreign file: what is missing or malformed inside it, in one line
        detail = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise ConfigError(f"checkpoint={path}: not a usable rltrain checkpoint ({type(err).__name__}"
                          f"{': ' + detail if detail else ''})") from None


# wrappers that write files where their arguments say: from a checkpoint, the file's author would choose
RECORDER_WRAPPERS = ("RecordVideo", "HumanRendering")
PATH_ARGUMENTS = ("folder", "path", "dir", "file", "prefix")


def _drop_recorders(wrappers: list, path: Path) -> list:
    """The checkpoint's ``env.wrappers`` without those that write files (one warning each): nothing stored in
    a checkpoint chooses where the tools write; ``rltrain-eval --video`` records into the run dir."""
    kept = []
    for entry in wrappers:
        name, kwargs = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()), ("", {}))
        args = kwargs if isinstance(kwargs, dict) else {}
        if name in RECORDER_WRAPPERS or any(part in str(k).lower() for k in args for part in PATH_ARGUMENTS):
            print(f"rltrain: warning: checkpoint={path}: ignoring its env.wrappers entry {name} (it would write "
                  "files where the checkpoint says; --video records into the run dir)", file=sys.stderr)
            continue
        kept.append(entry)
    return kept


def _policy_from(state: dict, path: Path, *, device: str, allow_import: bool):
    from rltrain.algos.base import Algorithm
    from rltrain.models.sac_networks import holds_separate_encoders

    cfg = state["meta"]["config"]
    env = cfg["env"]
    if not isinstance(env.get("wrappers") or [], list):
        raise ConfigError(f"checkpoint={path}: env.wrappers inside it is not a list")
    env["wrappers"] = _drop_recorders(list(env.get("wrappers") or []), path)
    env_id = env.get("id")
    if not isinstance(env_id, str):
        raise ConfigError(f"checkpoint={path}: env.id={env_id!r} inside it is not an env id")
    wrappers = [w if isinstance(w, str) else next(iter(w), "") for w in env.get("wrappers") or []]
    named = [f"env.id={env_id}"] if ":" in env_id else []
    named += [f"env.wrappers entry {w}" for w in wrappers if ":" in str(w)]
    named += [f"model.imports entry {m}" for m in (cfg.get("model") or {}).get("imports") or []]
    if named and not allow_import:
        raise ConfigError(f"checkpoint={path}: {named[0]} inside it names a module to import, which runs its "
                          "code; pass --allow-import if you trust this checkpoint")
    cls = resolve_target(cfg["algo"], "checkpoint algo")
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(f"checkpoint={path}: algo._target_={cfg['algo']['_target_']} inside it is not an "
                          "rltrain algorithm")
    if holds_separate_encoders(state["algo"]) and (cfg.get("model") or {}).get("shared", "auto") == "auto":
        # SAC on images written up to the shared critic encoder: build the layout the file holds
        cfg["model"] = {**(cfg.get("model") or {}), "shared": False}
    spec = env_factory(env, cfg["algo"]).spec()
    dev = pick_device(device)
    algo = algo_factory(cfg)(spec, num_envs=env["num_envs"], device=dev)
    algo.policy.load_state_dict(state["algo"]["policy"])  # the acting weights only: no optimiser, no buffer
    return algo.policy, cfg, path, int(state["meta"]["eval_seed"])

