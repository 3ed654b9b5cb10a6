"""Checkpoint -> policy for the tools (``rltrain-eval``, ``rltrain-export``, ``rltrain.load_policy``).

A checkpoint records the spaces its policy acts on (``PolicySpaces``, data/structs.py; a multi-agent env's: its
agents and every policy group, ``AgentsPolicySpaces``, data/agents.py), so the acting networks are built from the
file alone: no env is built and no env module imported. A checkpoint's config comes from whoever wrote the
file: nothing named inside it is imported without the user's opt-in (``--allow-import`` on the command
lines, ``allow_import=True`` in Python): a ``model.imports`` entry always (network code), the env's module
(``env.id`` ``module:Attr``, an ``env.wrappers`` entry ``module:Wrapper``) only to step the env (evaluation
episodes), or to build the network of a checkpoint written before the spaces were recorded. No wrapper stored
in it chooses where the tools write files.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rltrain import __version__
from rltrain.cli.build import algo_factory, env_factory, resolve_target
from rltrain.data.agents import AGENT_SPACES_FORMAT, AgentsPolicySpaces, AgentsSpec
from rltrain.data.structs import SPACES_FORMAT, EnvSpec, PolicySpaces
from rltrain.envs.make import EnvFactory, probe_env
from rltrain.errors import ConfigError
from rltrain.run.device import pick_device

CLI_OPT_IN = "--allow-import"  # how a command line user says it; Python callers pass their own spelling


@dataclass
class LoadedCheckpoint:
    """A checkpoint's acting policy and what the tools need beside it."""

    policy: Any = field(repr=False)  # the torch policy (``Policy``), acting weights loaded, on ``device``
    config: dict = field(repr=False)  # the run's resolved config, as recorded
    checkpoint: Path  # the file it came from
    eval_seed: int  # the run's evaluation seed
    spec: EnvSpec | AgentsSpec = field(repr=False)  # the env's spaces (recorded; probed for an older checkpoint)
    env: EnvFactory = field(repr=False)  # builds the env as the run did, to step it (evaluation episodes)
    # what stepping the env imports (``env.id=module:Attr``, ``env.wrappers`` entries): each needs the opt-in
    step_imports: list[str] = field(default_factory=list)

    @property
    def eval_steps(self) -> int | None:
        """The run's ``eval.max_episode_steps``: where its evaluation cut an episode, so the tools cut theirs
        there too (an env without a time limit of its own would otherwise run to the no-limit cap)."""
        return (self.config.get("eval") or {}).get("max_episode_steps")


def load_policy(path: Path, *, device: str = "cpu", allow_import: bool = False,
                opt_in: str = CLI_OPT_IN, key: str = "checkpoint") -> LoadedCheckpoint:
    """The policy of a checkpoint file or run dir (its final, else latest, checkpoint), for the tools.

    ``allow_import``: the user's opt-in to importing what the checkpoint names (see the module docstring);
    ``opt_in``: how the caller spells it, named in the refusal (``--allow-import``, ``allow_import=True``);
    ``key``: how the caller names the path, in every line about it (``checkpoint=``; the Python API's ``path=``).
    """
    from rltrain.run.checkpoint import CheckpointManager, load_checkpoint

    path = Path(path)
    if path.is_dir():
        ckdir = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        path = ckdir / "final.pt" if (ckdir / "final.pt").exists() else (CheckpointManager(ckdir).latest() or ckdir)
    state, _ = load_checkpoint(path, key=key)  # no run dir: its envs sidecar is never unpickled
    try:
        return _policy_from(state, path, device=device, allow_import=allow_import, opt_in=opt_in, key=key)
    except ConfigError as err:  # a setting inside the file: say which file
        if str(path) in str(err):
            raise
        raise ConfigError(f"{key}={path}: inside it, {err}") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as err:
        # a crafted or foreign file: what is missing or malformed inside it, in one line
        detail = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise ConfigError(f"{key}={path}: not a usable rltrain checkpoint ({type(err).__name__}"
                          f"{': ' + detail if detail else ''})") from None


def refuse_stepping(loaded: LoadedCheckpoint, opt_in: str = CLI_OPT_IN, key: str = "checkpoint") -> None:
    """Stepping the checkpoint's env imports what it names (``step_imports``): one line naming the opt-in."""
    if loaded.step_imports:
        raise ConfigError(f"{key}={loaded.checkpoint}: {loaded.step_imports[0]} inside it names a module to "
                          f"import to step the env, which runs its code; pass {opt_in} if you trust this "
                          "checkpoint (the policy itself loads without it)")


# the space records this version reads, by their format: one agent's (structs.py), a multi-agent env's (agents.py)
SPACE_RECORDS: dict[int, type[PolicySpaces] | type[AgentsPolicySpaces]] = {
    SPACES_FORMAT: PolicySpaces, AGENT_SPACES_FORMAT: AgentsPolicySpaces}


def recorded_spaces(meta: dict, path: Path, key: str = "checkpoint") -> PolicySpaces | AgentsPolicySpaces | None:
    """The spaces a checkpoint records; None for one written before they were (it loads as it always did, from
    its env); a record in a format this version does not read is one line naming both versions."""
    record = meta.get("spaces")
    if record is None:
        return None
    found = record.get("format") if isinstance(record, dict) else None
    if found not in SPACE_RECORDS:
        raise ConfigError(f"{key}={path}: its spaces are recorded in format {found!r} by rltrain "
                          f"{meta.get('rltrain', '(version not recorded)')}; rltrain {__version__} reads formats "
                          f"{', '.join(map(str, SPACE_RECORDS))}: load it with the version that wrote it, or a later "
                          "one")
    return SPACE_RECORDS[found].from_record(record)


# wrappers that write files where their arguments say: from a checkpoint, the file's author would choose
RECORDER_WRAPPERS = ("RecordVideo", "HumanRendering")
PATH_ARGUMENTS = ("folder", "path", "dir", "file", "prefix")


def _drop_recorders(wrappers: list, path: Path, key: str) -> list:
    """The checkpoint's ``env.wrappers`` without those that write files (one warning each): nothing stored in
    a checkpoint chooses where the tools write; ``rltrain-eval --video`` records into the run dir."""
    kept = []
    for entry in wrappers:
        name, kwargs = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()), ("", {}))
        args = kwargs if isinstance(kwargs, dict) else {}
        if name in RECORDER_WRAPPERS or any(part in str(k).lower() for k in args for part in PATH_ARGUMENTS):
            print(f"rltrain: warning: {key}={path}: ignoring its env.wrappers entry {name} (it would write "
                  "files where the checkpoint says; --video records into the run dir)", file=sys.stderr)
            continue
        kept.append(entry)
    return kept


def _mismatch(recorded: PolicySpaces | AgentsPolicySpaces, built: PolicySpaces | AgentsPolicySpaces) -> str | None:
    """How the network the checkpoint's settings build differs from what it recorded, in words; None: alike."""
    if isinstance(recorded, AgentsPolicySpaces):
        if not isinstance(built, AgentsPolicySpaces):
            return "it records a multi-agent env's policy groups, but its algo builds one policy"
        return recorded.difference(built)
    if not isinstance(built, PolicySpaces):
        return "it records one policy's spaces, but its algo builds a multi-agent env's policy groups"
    if built.core_state != recorded.core_state:
        return f"its recurrent state is {recorded.core_state}, but its settings build a network whose state is " \
               f"{built.core_state}"
    return None


def _policy_from(state: dict, path: Path, *, device: str, allow_import: bool, opt_in: str,
                 key: str) -> LoadedCheckpoint:
    from rltrain.algos.base import Algorithm, AlgoSettings
    from rltrain.models.sac_networks import holds_separate_encoders

    cfg = state["meta"]["config"]
    env = cfg["env"]
    if not isinstance(env.get("wrappers") or [], list):
        raise ConfigError(f"{key}={path}: env.wrappers inside it is not a list")
    env["wrappers"] = _drop_recorders(list(env.get("wrappers") or []), path, key)
    env_id = env.get("id")
    if not isinstance(env_id, str):
        raise ConfigError(f"{key}={path}: env.id={env_id!r} inside it is not an env id")
    wrappers = [w if isinstance(w, str) else next(iter(w), "") for w in env.get("wrappers") or []]
    stepping = [f"env.id={env_id}"] if ":" in env_id else []
    stepping += [f"env.wrappers entry {w}" for w in wrappers if ":" in str(w)]
    recorded = recorded_spaces(state["meta"], path, key)
    named = [f"model.imports entry {m}" for m in (cfg.get("model") or {}).get("imports") or []]
    named += [] if recorded else stepping  # an older checkpoint: its network is built from its env
    if named and not allow_import:
        older = "" if recorded or named[0] not in stepping else \
            " (it was written before checkpoints recorded their spaces, so its network is built from its env)"
        raise ConfigError(f"{key}={path}: {named[0]} inside it names a module to import, which runs its "
                          f"code{older}; pass {opt_in} if you trust this checkpoint")
    cls = resolve_target(cfg["algo"], "checkpoint algo")
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(f"{key}={path}: algo._target_={cfg['algo']['_target_']} inside it is not an "
                          "rltrain algorithm")
    if holds_separate_encoders(state["algo"]) and (cfg.get("model") or {}).get("shared", "auto") == "auto":
        # SAC on images written up to the shared critic encoder: build the layout the file holds
        cfg["model"] = {**(cfg.get("model") or {}), "shared": False}
    if recorded is not None:
        spec, factory = recorded.spec, env_factory(env, action_mask=recorded.action_mask)
    else:
        # a config recorded before algo.action_mask existed: the default
        probed = probe_env(env_factory(env), str(cfg["algo"].get("action_mask", AlgoSettings.action_mask)))
        spec, factory = probed.spec, probed.factory
    # the acting policy needs no replay: a goal task's hindsight relabelling (algo.her) stays off, so the env's
    # compute_reward is not looked for
    acting = {**cfg, "algo": {**cfg["algo"], "her": False}} if cfg["algo"].get("her") else cfg
    algo = algo_factory(acting)(spec, num_envs=env["num_envs"], device=pick_device(device))
    mismatch = None if recorded is None else _mismatch(recorded, algo.policy_spaces(recorded.action_mask))
    if mismatch:
        raise ConfigError(f"{key}={path}: {mismatch}")
    algo.policy.load_state_dict(state["algo"]["policy"])  # the acting weights only: no optimiser, no buffer
    return LoadedCheckpoint(algo.policy, cfg, path, int(state["meta"]["eval_seed"]), spec, factory,
                            [] if allow_import else stepping)


@contextlib.contextmanager
def callers_threads() -> Iterator[None]:
    """The Python API runs in the caller's process (a script, a notebook's kernel): a run there sets torch's
    threads (``run.process.init_process``) and numpy's OpenBLAS to one (``numpy_mlp.single_thread_blas``, also
    when a policy is loaded), so the caller's own torch / numpy work afterwards ran on one core. Put back what the
    caller had."""
    import torch

    from rltrain.models.numpy_mlp import blas_threads, set_blas_threads

    threads, blas, blas_env = torch.get_num_threads(), blas_threads(), os.environ.get("OPENBLAS_NUM_THREADS")
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if blas is not None and blas != blas_threads():
            set_blas_threads(blas)
        if blas_env is None:  # set for the run's child processes only
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
