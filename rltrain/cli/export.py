"""``rltrain-export <run dir or checkpoint> [--format export|onnx|torchscript] [--out FILE] [--force]``:
a standalone policy file.

The file maps a batch of observations to a batch of actions with nothing of rltrain needed to run it:
observation normalisation folded in, deterministic (the action distribution's mode: argmax for Discrete, the
Gaussian mean for Box, SAC's mean squashed by tanh and scaled to the bounds), Box actions clipped to the action
space as ``rltrain-eval`` does before stepping an env. Each policy supplies the module itself
(``export_module()``, built from its own action distribution), so a new registered distribution exports
with no change here. Beside the file, ``<name>.json`` describes its inputs and outputs and the checkpoint (path,
sha256); another format of the same checkpoint exported beside it is added to its ``files``.

    obs [B, *obs_shape] (the env's own dtype: float32, float64, uint8 / bool pixels, int64 Discrete ...)
        -> action [B] int64 | [B, *action_shape] (the env's own action dtype: float32, float64 ...)

Both ends are the env's own, translated inside the graph (``flat_actor``) as the env boundary translates them in
training: a float64 observation is cast to the float32 the policy reads, a Discrete(n, start=s) or MultiDiscrete
start is added to the action (the JSON's ``action.start``), a float64 Box's action is cast to float64 and
clipped to its exact bounds, and a Box of another number of axes than one (a (2, 2) Box, which the policy acts
on as 4 values) gets its action in its own shape: [B, 2, 2].

A Dict observation is one input per stored key, in the space's key order, named ``obs.<key>`` (nested:
``obs.<key>.<subkey>``). A recurrent policy (``model.core=lstm|gru``) takes its actor core's state as inputs
and returns the next one, each [1, B, core_size] float32 (LSTM: ``h``, ``c``; GRU: ``h``); start from zeros and
zero an env's state when its episode ends, as the collector and ``rltrain-eval`` do:

    obs..., h[, c] -> action, h_out[, c_out]

Formats: ``export`` (default) a ``torch.export`` ExportedProgram (``.pt2``, ``torch.export.load``);
``onnx`` converted from that same program by torch's ``dynamo=True`` exporter (onnxruntime); ``torchscript``
(``torch.jit.trace``, ``.pt``), which torch deprecates: kept for existing consumers, its warning shown.
The checkpoint loads through ``rltrain.cli.loading.load_policy``, as in ``rltrain-eval`` and
``rltrain.load_policy``: the network is built from the spaces the checkpoint records, so no env is built and the
env's module is not imported; a ``model.imports`` module it names is imported only with ``--allow-import``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from rltrain.cli.args import OneLineParser
from rltrain.cli.descriptions import describe, described_files, file_sha256
from rltrain.errors import ConfigError

if TYPE_CHECKING:
    from rltrain.data.structs import EnvSpec

FORMATS = {"export": ".pt2", "onnx": ".onnx", "torchscript": ".pt"}
DEFAULT_FORMAT = "export"
EXAMPLE_BATCH = 2  # torch.export specialises sizes 0 and 1: a batch of 2 keeps the batch axis symbolic


def run_dir_of(path: Path) -> Path:
    """The run dir a checkpoint file or run dir argument belongs to (where the default export goes)."""
    path = Path(path)
    if path.is_dir():
        return path.parent if path.name == "checkpoints" else path
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


def target_of(path: Path, fmt: str, out: Path | None, *, force: bool) -> Path:
    """The file to write, checked before anything loads (a refused command writes nothing)."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format={fmt}: unknown format; use {', '.join(FORMATS)}")
    target = Path(out) if out is not None else run_dir_of(path) / "export" / f"policy{FORMATS[fmt]}"
    flag = output_flag(out, target)
    if target.is_dir():
        raise ConfigError(f"{flag}: is a directory; --out names the file to write (e.g. {target / 'policy'}"
                          f"{FORMATS[fmt]})")
    if target.suffix == ".json":
        raise ConfigError(f"{flag}: .json is the name of the description written beside the policy; "
                          f"name the policy file (e.g. {target.with_suffix(FORMATS[fmt])})")
    for written in (target, target.with_suffix(".json")):
        owner = run_file_owner(written)
        if owner is not None:  # SQLite's rule: a tool never overwrites what it did not write, --force or not
            raise ConfigError(f"{flag}: {written} is a file of the run in {owner} (a checkpoint, its summary or "
                              "config); no tool writes over a run's files: pick another --out")
    if target.exists() and not force:
        raise ConfigError(f"{flag}: exists; pass --force to replace it, or another --out")
    return target


def output_flag(out: Path | None, target: Path) -> str:
    """How a refusal names the output: the ``--out`` given, or the default it stands for."""
    return f"--out={out}" if out is not None else f"the default output {target}"


def run_file_owner(path: Path) -> Path | None:
    """The run dir ``path`` belongs to as one of its own files (anything in its ``checkpoints/``, or a file a run
    writes at its top), else None. A run dir holds a ``config.yaml`` or ``summary.json`` (or the lock)."""
    from rltrain.run.lock import LOCK_FILE, OWN_FILES

    path = Path(os.path.abspath(path))
    parent = path.parent
    run_dir = parent.parent if parent.name == "checkpoints" else parent if path.name in OWN_FILES else None
    if run_dir is not None and any((run_dir / n).exists() for n in ("config.yaml", "summary.json", LOCK_FILE)):
        return run_dir
    return None


def leaf_names(space) -> list[tuple[str, ...]]:
    """The key path of each stored observation array, in ``obs_leaves`` order (() for a plain array)."""
    if space.kind != "dict":
        return [()]
    return [(key, *sub) for key, part in space.parts if part.kind != "unsupported" for sub in leaf_names(part)]


def leaf_spaces(space) -> list:
    """The space of each stored observation array, in ``leaf_names`` order."""
    if space.kind != "dict":
        return [space]
    return [leaf for _, part in space.parts if part.kind != "unsupported" for leaf in leaf_spaces(part)]


def example_leaves(space, batch: int) -> list:
    """One valid batch per stored array, in the env's own dtype (what the file takes: a float64 observation is
    cast inside the graph); values are irrelevant to the graph (Discrete ones at ``start``)."""
    import numpy as np
    import torch

    return [torch.as_tensor(np.full((batch, *leaf.shape), leaf.start if leaf.kind == "discrete" else 0,
                                    dtype=np.dtype(leaf.dtype or np.float32))) for leaf in leaf_spaces(space)]


def flat_actor(actor, spec: EnvSpec):
    """``actor`` (obs tree (+ state) -> action (+ state)) taking one positional tensor per stored observation
    array, then the state: the form every format shares (ONNX inputs are flat and named). At both ends the file
    speaks the env's own dtypes, translated inside the graph as the env boundary does in training: an observation
    whose dtype is not its storage dtype (float64, float16) is cast to it, so ``env.reset()[0]`` goes in as it is;
    a Discrete(n, start=s) env's s is added to the action index; an action space of another dtype than the
    policy's (a float64 Box) gets its action cast, a Box's clipped to its exact bounds (as ``load_policy``'s), and a
    Box of another number of axes than one gets the policy's flat action in its own shape ((2, 2), ())."""
    import numpy as np
    import torch
    from torch import nn

    from rltrain.data.structs import storage_dtype

    paths = leaf_names(spec.observation)
    # per input: the torch dtype the policy reads it in, where the env's own differs (None: taken as it is)
    leaves = [(np.dtype(leaf.dtype or np.float32), storage_dtype(leaf.dtype)) for leaf in leaf_spaces(spec.observation)]
    casts = [getattr(torch, stored.name) if stored != given else None for given, stored in leaves]
    start = spec.action_start[0] if spec.action_kind == "discrete" and spec.action_start else 0
    own = getattr(torch, spec.env_action_dtype) if spec.env_action_dtype else None
    shape = spec.env_action_shape if spec.action_kind == "box" else None  # a (2, 2) Box's: the flat 4 reshaped

    class FlatActor(nn.Module):
        def __init__(self):
            super().__init__()
            self.actor = actor
            if own is not None and spec.action_kind == "box":
                for name, bound in (("low", spec.action_low), ("high", spec.action_high)):
                    self.register_buffer(name, torch.tensor(bound, dtype=own).reshape(spec.action_shape))

        def forward(self, *inputs):
            if any(casts):  # decided at construction: a float32 env's graph has no cast
                n = len(paths)
                inputs = (*(x if t is None else x.to(t) for x, t in zip(inputs[:n], casts, strict=True)), *inputs[n:])
            out = self._act(*inputs)
            action, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, None)
            if start:
                action = action + start
            if own is not None:
                action = action.to(own)
                if spec.action_kind == "box":
                    action = torch.minimum(torch.maximum(action, self.low), self.high)
            if shape is not None:
                action = action.reshape(action.shape[0], *shape)
            return action if rest is None else (action, *rest)

        def _act(self, *inputs):
            n = len(paths)
            if paths == [()]:
                obs = inputs[0]
            else:
                obs = {}
                for path, leaf in zip(paths, inputs[:n], strict=True):
                    node = obs
                    for key in path[:-1]:
                        node = node.setdefault(key, {})
                    node[path[-1]] = leaf
            return self.actor(obs, *inputs[n:])

    return FlatActor().eval()


def export(path: Path, *, fmt: str = DEFAULT_FORMAT, out: Path | None = None, force: bool = False,
           allow_import: bool = False) -> Path:
    """Write the policy file (``out``, default ``<run dir>/export/policy.<ext>``) and ``<out stem>.json``
    beside it; returns the policy file (a multi-agent env's first agent's: ``export_files`` returns them all)."""
    return export_files(path, fmt=fmt, out=out, force=force, allow_import=allow_import)[0]


def export_files(path: Path, *, fmt: str = DEFAULT_FORMAT, out: Path | None = None, force: bool = False,
                 allow_import: bool = False) -> list[Path]:
    """``export``, returning every policy file written: one, or one per agent of a multi-agent env
    (``<target stem>_<agent><ext>``, each taking that agent's own observation; its index in a shared policy is
    added inside), each with its ``.json``. Every refusal comes before any file is written."""
    target = target_of(Path(path), fmt, out, force=force)
    if fmt == "onnx":
        missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(f"--format=onnx needs {' and '.join(missing)}: pip install 'rltrain[export]'")

    from rltrain.cli.loading import load_policy

    loaded = load_policy(Path(path), device="cpu", allow_import=allow_import)  # no env built or imported
    if getattr(loaded.policy, "group_list", None) is not None:  # a multi-agent env: one file per agent
        policies = {target.with_name(f"{target.stem}_{agent}{target.suffix}"): (policy, policy.spec)
                    for agent, policy in loaded.policy.per_agent().items()}
    else:
        policies = {target: (loaded.policy, loaded.spec)}
    source = {"checkpoint": str(loaded.checkpoint.resolve()), "checkpoint_sha256": file_sha256(loaded.checkpoint)}
    kept = {}
    for each in policies:
        if each.exists() and not force:
            raise ConfigError(f"{each}: exists; pass --force to replace it, or another --out")
        kept[each] = described_files(each, fmt, source, force=force, flag=output_flag(out, target))
    return [write_policy(policy.export_module(), spec, each, fmt=fmt, cfg=loaded.config, source=source,
                         files=kept[each]) for each, (policy, spec) in policies.items()]


def write_policy(actor, spec, target: Path, *, fmt: str, cfg: dict, source: dict, files: dict[str, str]) -> Path:
    """Trace ``actor`` (an export module) for observations of ``spec`` into ``target`` and its ``.json``
    (``source``: the checkpoint's path and sha256; ``files``: the other formats' files it goes on listing)."""
    import torch

    actor = actor.eval().requires_grad_(False)
    for tensor in [*actor.parameters(), *actor.buffers()]:  # own storage each: fused weights share one buffer,
        tensor.data = tensor.data.clone()                     # which the .pt2 archive cannot split cleanly
    state_names = list(actor.state_names)
    paths = leaf_names(spec.observation)
    names = ["obs" if p == () else "obs." + ".".join(p) for p in paths] + state_names
    example = tuple(example_leaves(spec.observation, EXAMPLE_BATCH))
    # a non-zero example state, so that tracing cannot fold the state away
    example += tuple(torch.full((1, EXAMPLE_BATCH, actor.state_size), 0.5) for _ in state_names)
    module = flat_actor(actor, spec)
    with torch.no_grad():
        outputs = module(*example)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}{FORMATS[fmt]}")  # the suffix torch expects
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with warnings.catch_warnings():
                # torch's own noise on a sound export, filtered by its exact text here only: the .pt2 archive
                # groups zero-size buffers (the encoders' device anchors) as one storage with no "complete"
                # tensor, and the ONNX exporter calls a pytree check torch itself deprecates
                warnings.filterwarnings("ignore", message="No complete tensor found in the group", category=UserWarning)
                warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                        category=FutureWarning)
                WRITERS[fmt](module, example, tmp, names, len(paths), len(outputs))
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        record = describe(spec, fmt=fmt, target=target, cfg=cfg, source=source, files=files, names=names,
                          example=example, outputs=outputs, state_names=state_names)
        target.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    except OSError as err:  # an unwritable or missing place, a full disk: one line naming it
        where = err.filename or target
        raise ConfigError(f"--out={target}: cannot write {where} ({err.strerror or err}); pick a writable --out") \
            from None
    return target


def exported_program(module, example: tuple, n_obs: int):
    """``torch.export.export`` with the batch axis symbolic (axis 0 of observations, 1 of states)."""
    import torch

    batch = torch.export.Dim("batch")
    axes = tuple({0 if i < n_obs else 1: batch} for i in range(len(example)))
    with torch.no_grad():
        return torch.export.export(module, example, dynamic_shapes=(axes,))


def write_export(module, example: tuple, target: Path, names: list[str], n_obs: int, n_out: int) -> None:
    import torch

    try:
        program = exported_program(module, example, n_obs)
    except Exception as err:  # noqa: BLE001 - e.g. a user's encoder with data-dependent control flow
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ConfigError(f"--format=export: torch.export cannot capture this policy ({type(err).__name__}: "
                          f"{reason}); --format onnx falls back to torch's older exporter") from None
    torch.export.save(program, str(target))


def write_onnx(module, example: tuple, target: Path, names: list[str], n_obs: int, n_out: int) -> None:
    """Through torch's ``dynamo=True`` exporter, from the same ExportedProgram ``--format export`` writes.
    Where it cannot convert a policy (e.g. a user's encoder with an op that has no ONNX translation yet), one
    line says why and the TorchScript-based exporter (``dynamo=False``) writes the file instead."""
    import torch

    state = names[n_obs:]
    out_names = ["action", *(f"{n}_out" for n in state)][:n_out]
    try:
        program = exported_program(module, example, n_obs)
        with _quiet_onnx_registry():
            torch.onnx.export(program, (), str(target), input_names=names, output_names=out_names, dynamo=True,
                              external_data=False, verbose=False)
        return
    except (ImportError, ModuleNotFoundError):
        raise
    except Exception as err:  # noqa: BLE001 - any exporter failure: said in one line, then the fallback
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        print(f"rltrain-export: warning: the dynamo ONNX exporter failed ({type(err).__name__}: {reason}); "
              "falling back to torch.onnx.export(dynamo=False)", file=sys.stderr)
    axes = {n: {0 if i < n_obs else 1: "batch"} for i, n in enumerate(names)}
    axes.update({n: {0 if i == 0 else 1: "batch"} for i, n in enumerate(out_names)})
    torch.onnx.export(module, example, str(target), input_names=names, output_names=out_names,
                      dynamic_axes=axes, dynamo=False)


class _quiet_onnx_registry:
    """The dynamo exporter logs one warning per torchvision op it cannot register when torchvision is absent:
    irrelevant to a policy, so its registry logger is raised to ERROR for the call (and restored)."""

    NAME = "torch.onnx._internal.exporter._registration"

    def __enter__(self):
        import logging

        self.logger = logging.getLogger(self.NAME)
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)


def write_torchscript(module, example: tuple, target: Path, names: list[str], n_obs: int, n_out: int) -> None:
    """``torch.jit.trace``. Torch deprecates TorchScript with a DeprecationWarning, which Python hides outside
    ``__main__``: it is caught here and said on stderr with the successor this command writes."""
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.jit.trace(module, example).save(str(target))
    said = next((str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)), "")
    print(f"rltrain-export: warning: TorchScript is deprecated by torch{f' ({said})' if said else ''}; "
          "--format export writes its successor (a torch.export program, torch.export.load)", file=sys.stderr)
    for w in caught:  # anything else torch said, as it said it
        if not issubclass(w.category, DeprecationWarning):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


WRITERS = {"export": write_export, "onnx": write_onnx, "torchscript": write_torchscript}


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="rltrain-export", description="a standalone policy file: a batch of "
                                "observations in, the deterministic actions out, no rltrain needed to run it")
    p.add_argument("path", help="a checkpoint file (.pt) or a run directory (its final or latest checkpoint)")
    p.add_argument("--format", default=DEFAULT_FORMAT,
                   help="export (default: torch.export ExportedProgram, .pt2), onnx (onnxruntime, .onnx) or "
                        "torchscript (deprecated by torch, .pt)")
    p.add_argument("--out", type=Path, default=None,
                   help="the file to write (default: <run dir>/export/policy.pt2|.onnx|.pt); "
                        "a description goes beside it as <name>.json")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--allow-import", action="store_true",
                   help="let a module the checkpoint names for its network (model.imports; the env's module for a "
                        "checkpoint older than its recorded spaces) be imported (trusted files only)")
    args = p.parse_args(argv)
    from rltrain.run.process import init_process

    init_process(torch_threads=1)  # as every rltrain process: it builds and traces small networks
    try:
        written = export_files(Path(args.path), fmt=args.format, out=args.out, force=args.force,
                               allow_import=args.allow_import)
    except ConfigError as err:
        print(f"rltrain-export: error: {err}", file=sys.stderr)
        return 2
    for each in written:  # a multi-agent env's: one pair per agent
        print(f"wrote {each} and {each.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
