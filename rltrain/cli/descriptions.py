"""The JSON description beside an exported policy file (``rltrain-export``, cli/export.py): its inputs and
outputs, the action space, and the checkpoint it came from (path and sha256), which lets another format of the
same checkpoint join it and refuses one of anything else."""

from __future__ import annotations

import json
from pathlib import Path

from rltrain.errors import ConfigError


def described_files(target: Path, fmt: str, source: dict, *, force: bool, flag: str) -> dict[str, str]:
    """The other formats' files that the description beside ``target`` lists and goes on listing: those exported
    from the same checkpoint (``source``: its path and sha256) that are still there. A description of anything
    else (another checkpoint, the same path since rewritten, a file no export wrote) is refused in one line:
    merging would credit its files to this checkpoint. ``force`` writes a fresh description instead."""
    sidecar = target.with_suffix(".json")
    if not sidecar.exists():
        return {}
    try:
        old = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        old = None
    files = old.get("files") if isinstance(old, dict) else None
    if isinstance(files, dict) and all(old.get(k) == v for k, v in source.items()):
        return {f: n for f, n in files.items() if isinstance(f, str) and isinstance(n, str) and f != fmt
                and n != target.name and n == Path(n).name and (target.parent / n).is_file()}
    if force:
        return {}
    if not isinstance(files, dict) or not isinstance(old.get("checkpoint"), str):
        what = "is not the description of an export"
    elif old["checkpoint"] != source["checkpoint"]:
        what = f"describes an export of another checkpoint ({old['checkpoint']})"
    elif "checkpoint_sha256" not in old:  # an earlier rltrain-export's: the content it came from is unknown
        what = f"describes an export of {old['checkpoint']} that records no checkpoint_sha256 to match"
    else:
        what = f"describes an export of {old['checkpoint']} before it was rewritten (another checkpoint_sha256)"
    raise ConfigError(f"{flag}: {sidecar} {what}; pass --force to write a fresh description, or another --out")


def file_sha256(path: Path) -> str:
    """The checkpoint's content digest: its path alone does not tell a rewritten final.pt from the one exported."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe(spec, *, fmt: str, target: Path, cfg: dict, source: dict, files: dict[str, str], names: list[str],
             example: tuple, outputs: tuple, state_names: list[str]) -> dict:
    """The JSON beside the policy file: every input and output with its shape and dtype ("B": the batch), the
    checkpoint (``source``) and the files exported from it beside this one (``files``: format -> name)."""
    import numpy as np

    def tensor(name, t, batch_axis=0):
        shape: list = list(t.shape)
        shape[batch_axis] = "B"
        return {"name": name, "shape": shape, "dtype": str(t.dtype).removeprefix("torch.")}

    n_obs = len(names) - len(state_names)
    inputs = [tensor(n, t, 0 if i < n_obs else 1) for i, (n, t) in enumerate(zip(names, example, strict=True))]
    out_names = ["action", *(f"{n}_out" for n in state_names)]
    outs = [tensor(n, t, 0 if i == 0 else 1) for i, (n, t) in enumerate(zip(out_names, outputs, strict=True))]
    action = {"kind": spec.action_kind, "shape": outs[0]["shape"][1:], "dtype": outs[0]["dtype"]}
    if spec.action_kind == "multi_discrete":
        action["nvec"], action["start"] = list(spec.nvec), list(spec.action_start)
    elif spec.n_actions:  # the file's action is index + start: the env's own value
        action["n"], action["start"] = spec.n_actions, (spec.action_start or (0,))[0]
    if spec.action_low:  # in the action's own shape (a (2, 2) Box's: nested lists)
        action["low"], action["high"] = (np.reshape(b, spec.own_action_shape).tolist()
                                         for b in (spec.action_low, spec.action_high))
    record = {"files": {**files, fmt: target.name}, "env_id": spec.env_id, "algo": cfg["algo"]["_target_"],
              **source, "inputs": inputs, "outputs": outs, "action": action}
    # the observations the file takes are the env's after the run's own wrappers (Atari's preprocessing and frame
    # stack, a user's): a deployment has to build the env the same way (``LoadedPolicy.make_env`` does, in Python)
    env = cfg.get("env") or {}
    record["env"] = {"id": env.get("id"), "kwargs": env.get("kwargs") or {}, "wrappers": env.get("wrappers") or [],
                     "max_episode_steps": env.get("max_episode_steps"),
                     "note": "make the env with these kwargs and apply these wrappers in order (first innermost): "
                             "the observations this file takes are theirs"}
    if n_obs == 1 and names[0] == "obs":
        record["observation"] = {"shape": inputs[0]["shape"][1:], "dtype": inputs[0]["dtype"]}
    if state_names:
        record["state"] = {"names": state_names, "shape": inputs[-1]["shape"], "dtype": "float32",
                           "initial": "zeros",
                           "reset": "zero an env's columns when its episode ends (terminated or truncated)"}
    return record
