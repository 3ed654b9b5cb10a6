"""``rltrain-export <run dir or checkpoint> --format torchscript|onnx [--out DIR]``: a standalone policy.

The file maps a batch of observations to a batch of actions with nothing of rltrain needed to run it:
observation normalisation folded in, deterministic (argmax for Discrete, the Gaussian mean for Box, SAC's
mean squashed by tanh and scaled to the bounds), Box actions clipped to the action space as ``rltrain-eval``
does before stepping an env. Beside it, ``policy.json`` describes the spaces. The checkpoint is loaded through
``rltrain.cli.build.load_policy``: nothing named inside it is imported without ``--allow-import``.

    obs [B, *obs_shape] (the env's dtype: float32, uint8 pixels ...) -> action [B] int64 | [B, *action_shape] float32

A recurrent policy (``model.core=lstm|gru``) exports its actor core's state as inputs and outputs, each
[1, B, core_size] float32 (LSTM: ``h``, ``c``; GRU: ``h``); start from zeros and zero an env's state when its
episode ends, as the collector and ``rltrain-eval`` do:

    obs, h[, c] -> action, h_out[, c_out]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from rltrain.errors import ConfigError

FORMATS = {"torchscript": "policy.pt", "onnx": "policy.onnx"}


def deterministic_actor(policy, spec):
    """An ``nn.Module`` obs (+ state) -> action that runs only torch ops (no numpy fast path, no sampling):
    the policy's own ``export_module()``, frozen (the exported graph returns plain tensors)."""
    return policy.export_module().eval().requires_grad_(False)


def state_names(policy) -> list[str]:
    """The exported state inputs of a recurrent policy's actor core ([] when feed-forward)."""
    return list(policy.export_module().state_names)


def spaces_record(spec, *, out: Path, cfg: dict, checkpoint: Path, policy=None) -> dict:
    """The JSON beside the policy files: what goes in, what comes out."""
    if spec.action_kind == "discrete":
        action = {"kind": "discrete", "n": spec.n_actions, "dtype": "int64"}
    elif spec.action_kind == "multi_discrete":
        action = {"kind": "multi_discrete", "nvec": list(spec.nvec), "start": list(spec.action_start),
                  "shape": list(spec.action_shape), "dtype": "int64"}
    elif spec.action_kind == "multi_binary":
        action = {"kind": "multi_binary", "shape": list(spec.action_shape), "dtype": "int8"}
    else:
        action = {"kind": "box", "shape": list(spec.action_shape), "dtype": "float32",
                  "low": list(spec.action_low), "high": list(spec.action_high)}
    files = {fmt: name for fmt, name in FORMATS.items() if (out / name).exists()}
    record = {"files": files, "env_id": spec.env_id, "algo": cfg["algo"]["_target_"],
              "checkpoint": str(checkpoint.resolve()), "input": "obs [B, *shape]",
              "output": "action [B] or [B, *shape]",
              "observation": {"shape": list(spec.obs_shape), "dtype": spec.obs_dtype}, "action": action}
    names = state_names(policy)
    if names:
        size = policy.export_module().state_size
        record["input"] += "".join(f", {n} [1, B, {size}]" for n in names)
        record["output"] += "".join(f", {n}_out [1, B, {size}]" for n in names)
        record["state"] = {"names": names, "shape": [1, "B", size], "dtype": "float32", "initial": "zeros",
                           "reset": "zero an env's columns when its episode ends (terminated or truncated)"}
    return record


def example_observations(spec, batch: int = 2):
    """A batch in the observation space's dtype (values are irrelevant: tracing records the ops)."""
    import numpy as np
    import torch

    return torch.as_tensor(np.zeros((batch, *spec.obs_shape), dtype=np.dtype(spec.obs_dtype)))


def export(path: Path, *, fmt: str, out: Path | None = None, allow_import: bool = False) -> Path:
    """Write ``policy.pt`` / ``policy.onnx`` and ``policy.json`` into ``out``; returns the policy file."""
    import torch

    from rltrain.cli.build import env_factory, load_policy

    if fmt not in FORMATS:
        raise ConfigError(f"--format={fmt}: unknown format; use torchscript or onnx")
    policy, cfg, ckpt_path, _ = load_policy(Path(path), device="cpu", allow_import=allow_import)
    spec = env_factory(cfg["env"], cfg.get("algo")).spec()
    if spec.obs_space is not None and spec.observation.kind != "box":
        raise ConfigError(f"checkpoint={ckpt_path}: observations of {spec.observation.name} cannot be exported "
                          "(Box observations only: one array in, one action out)")
    out = Path(out) if out else ckpt_path.parent.parent / "export"
    out.mkdir(parents=True, exist_ok=True)
    actor = deterministic_actor(policy, spec)
    example = example_observations(spec)
    names = state_names(policy)
    if names:  # a non-zero example state, so that tracing cannot fold the state away
        size = actor.state_size
        example = (example, *(torch.full((1, example.shape[0], size), 0.5) for _ in names))
    else:
        example = (example,)
    target = out / FORMATS[fmt]
    with torch.no_grad():
        if fmt == "torchscript":
            with warnings.catch_warnings():  # torch 2.13 marks jit.trace deprecated; torch.jit.load still reads it
                warnings.simplefilter("ignore", DeprecationWarning)
                torch.jit.trace(actor, example).save(str(target))
        else:
            _onnx(actor, example, target, names)
    record = spaces_record(spec, out=out, cfg=cfg, checkpoint=ckpt_path, policy=policy)
    (out / "policy.json").write_text(json.dumps(record, indent=2) + "\n")
    return target


def _onnx(actor, example: tuple, target: Path, names: list[str]) -> None:
    import importlib.util

    import torch

    if importlib.util.find_spec("onnx") is None:
        raise ConfigError("--format=onnx needs the onnx package: pip install 'rltrain[export]'")
    # the TorchScript-based exporter (the torch.export one needs onnxscript too): our actors are straight-line
    # torch ops, which it handles; its deprecation notice is about exporters, not about this file
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        outs = [f"{n}_out" for n in names]
        axes = {"obs": {0: "batch"}, "action": {0: "batch"}, **{n: {1: "batch"} for n in [*names, *outs]}}
        torch.onnx.export(actor, example, str(target), input_names=["obs", *names], output_names=["action", *outs],
                          dynamic_axes=axes, dynamo=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rltrain-export", description=__doc__.splitlines()[0].split(": ", 1)[1])
    p.add_argument("path", help="a checkpoint file (.pt) or a run directory (its final or latest checkpoint)")
    p.add_argument("--format", default="torchscript", help="torchscript (torch.jit.load) or onnx (onnxruntime)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: <run dir>/export)")
    p.add_argument("--allow-import", action="store_true",
                   help="let an env.id import path stored in the checkpoint import its module (trusted files only)")
    args = p.parse_args(argv)
    try:
        target = export(Path(args.path), fmt=args.format, out=args.out, allow_import=args.allow_import)
    except ConfigError as err:
        print(f"rltrain-export: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {target} and {target.with_name('policy.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
