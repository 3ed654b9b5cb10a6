"""What a resume may change: a checkpoint's recorded config brought to today's keys (``upgrade_config``), and
the settings in which this run differs from it, refused unless the user allows them (``config_changes``,
``resume_mismatch``); keys that only place or bound the work (where processes run, time-outs) are never
compared, since changing them changes no result."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path


def upgrade_config(cfg: dict) -> dict:
    """A config recorded by an older rltrain (a checkpoint's, a run dir's config.yaml) in today's keys, in
    place: ``algo.hidden_sizes`` / ``algo.activation`` become ``model.hidden_sizes`` / ``model.activation``
    (the MLP is one setting; a value the model group set was the one the run used), ``algo.checkpoint_buffer``
    is dropped (the CLI passes ``checkpoint.replay_buffer``), and so is ``model._target_`` (and the DQN presets'
    unread ``model.hidden_sizes``)."""
    algo = cfg.get("algo")
    if isinstance(algo, dict):
        model = cfg.get("model")
        if not isinstance(model, dict):
            model = cfg["model"] = {}
        for key in ("hidden_sizes", "activation"):
            if key in algo:
                value = algo.pop(key)
                if model.get(key) is None:
                    model[key] = value
        algo.pop("checkpoint_buffer", None)
    if isinstance(cfg.get("model"), dict):
        cfg["model"].pop("_target_", None)
        model = cfg["model"]
        # experiment=dqn_atari / dqn_minatar recorded model.hidden_sizes [120, 84], which their CNN's Q head never
        # read (removed from the presets, as rltrain now says of an unread key: cli/unread.py): not compared
        if model.get("encoder") in ("nature", "minatar") and model.get("hidden_sizes") == [120, 84] and \
                str((algo or {}).get("_target_", "")).startswith("rltrain.algos.dqn."):
            model.pop("hidden_sizes")
    return cfg


# What a checkpoint's run and this one must share, unless the user names the key in ``resume_allow_changes``:
# everything under these groups, but the keys that only place or bound the work (changing them changes no result).
RESUME_GROUPS = ("trainer", "algo", "model", "env")
PLACEMENT_KEYS = ("trainer._partial_", "trainer.start_method", "trainer.heartbeat_timeout_s",
                  "trainer.shutdown_grace_s", "trainer.timeout_s", "trainer.master_addr", "trainer.actor_timeout_s",
                  "trainer.actor_device", "trainer.learner_device", "trainer.devices", "env.vectorization",
                  "env.step_timeout_s", "env.solved_return", "algo.numpy_update",
                  # where ModelSettings lives (it moved to models/settings.py) and the launch directory: not the run
                  "model._target_", "env.search_path")
# a trainer that checks its own layout on resume: distributed ranks may change while the global batch stays
TRAINER_PLACEMENT = {"rltrain.trainers.distributed.DistributedSimulatorTrainer": ("env.num_envs",
                                                                                  "trainer.world_size"),
                     # where the actors run and how many: a fresh cluster (another Ray head address, other node
                     # resources) or another actor count continues the same learner
                     "rltrain.trainers.actors.learner.SubprocessActorsTrainer": ("trainer.ray", "trainer.backend",
                                                                                 "trainer.num_actors")}
ALLOW_KEY = "resume_allow_changes"
_ABSENT = object()


def _flat(node, prefix: str, out: dict) -> dict:
    """``{"env.kwargs.length": 20, ...}``; an empty dict contributes no key (``{}`` and unset are the same)."""
    if isinstance(node, dict):
        for key, value in node.items():
            _flat(value, f"{prefix}.{key}", out)
    else:
        out[prefix] = node
    return out


def config_changes(saved: dict, current: dict, allow: Collection[str] = (), *,
                   unread: Collection[str] = ()) -> tuple[list[str], list[str]]:
    """The settings that differ between a checkpoint's config and this run's: (refused, allowed), each as
    ``key: old -> new``. A key is allowed when ``allow`` names it or a group above it (``env.kwargs``, ``env``).
    Keys a checkpoint older than them does not record are not compared, nor ``unread``: the keys this run will
    not read (``RunSettings.unread_keys``; ``algo.n_quantiles`` without a QR head), whose value cannot change
    what it computes, whatever the checkpoint's run read."""
    refused, allowed = [], []
    trainer = (current.get("trainer") or {}).get("_target_") if isinstance(current.get("trainer"), dict) else None
    placement = (*PLACEMENT_KEYS, *TRAINER_PLACEMENT.get(str(trainer), ()))
    for group in RESUME_GROUPS:
        if not isinstance(saved.get(group), dict):
            continue
        was, now = _flat(saved[group], group, {}), _flat(current.get(group) or {}, group, {})
        for key in sorted(set(was) | set(now)):
            old, new = was.get(key, _ABSENT), now.get(key, _ABSENT)
            field = key.split(".")[1]
            placed = any(key == p or key.startswith(f"{p}.") for p in placement)  # a key or a group of them
            if old == new or placed or key in unread or field not in saved[group]:  # or an older one's gap
                continue
            before, after = ("(unset)" if v is _ABSENT else repr(v) for v in (old, new))
            line = f"{key}: {before} -> {after}"
            ok = any(key == a or key.startswith(f"{a}.") for a in allow)
            (allowed if ok else refused).append(line)
    return refused, allowed


def resume_mismatch(path: Path | str, saved: dict, current: dict, *, unread: Collection[str] = ()) -> str | None:
    """One line listing every trainer / algorithm / model / env setting in which this run differs from the
    checkpoint's (``meta.config``) and that ``resume_allow_changes`` does not name, else None (``unread``: as
    ``config_changes``)."""
    refused, _ = config_changes(saved, current, current.get(ALLOW_KEY) or (), unread=unread)
    if not refused:
        return None
    keys = ",".join(line.split(":")[0] for line in refused)
    return (f"resume={path}: this run's settings differ from the checkpoint's: {'; '.join(refused)}. Resume with "
            f"the checkpoint's settings, or allow the change with {ALLOW_KEY}=[{keys}] (the run then trains with "
            "the new values), or start a fresh run in another hydra.run.dir")
