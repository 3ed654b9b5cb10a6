"""One root seed, a SeedSequence tree for everything else.

``seed + i`` schemes make runs with neighbouring seeds share most of their env streams (run 1's env 1 is
run 2's env 0); ``SeedSequence.spawn`` gives statistically independent children, and the tree is recorded
in ``seeds.json`` so any worker can be replayed alone.
"""

from __future__ import annotations

import json
import random
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True)
class SeedTree:
    """Seeds for one agent/worker: its torch seed, its training env seeds and its eval env seed base."""

    root: int
    path: tuple[int, ...]  # spawn key below the root, () for the root's own worker
    torch_seed: int
    env_seeds: tuple[int, ...]
    eval_seed: int

    def to_dict(self) -> dict:
        return asdict(self)


def draw_root_seed() -> int:
    """A fresh root seed for ``seed=null`` (recorded, so the run stays reproducible)."""
    return secrets.randbits(31)


def _as_int(seq: np.random.SeedSequence) -> int:
    return int(seq.generate_state(1, dtype=np.uint32)[0] & 0x7FFFFFFF)


def derive(root: int, num_envs: int, *, path: tuple[int, ...] = ()) -> SeedTree:
    """Derive the seeds of the worker at ``path`` (e.g. ``(k,)`` for agent k) under ``root``.

    Children of one node: [0] torch, [1] eval, [2 + i] env i. Workers hang below the root's
    spawn keys, so agent k of a parallel run equals a sequential run whose root is ``worker_root(root, (k,))``.
    """
    node = np.random.SeedSequence(root, spawn_key=path)
    torch_child, eval_child, *env_children = node.spawn(2 + num_envs)
    return SeedTree(
        root=root,
        path=path,
        torch_seed=_as_int(torch_child),
        env_seeds=tuple(_as_int(c) for c in env_children),
        eval_seed=_as_int(eval_child),
    )


def resumed_env_seeds(seeds: tuple[int, ...] | list[int], env_steps: int) -> list[int]:
    """Env seeds for a session that resumes at ``env_steps`` without its envs' pickled state (another env count,
    a distributed rank above 0, ``env.vectorization=async``, an env that does not pickle): reset with the run's
    own ``seeds`` again, those envs would replay the first session's episodes. Drawn from the run's seeds and
    the step, so the same resume draws the same seeds."""
    node = np.random.SeedSequence([int(s) for s in seeds] + [int(env_steps)])
    return [_as_int(child) for child in node.spawn(len(seeds))]


def worker_root(root: int, path: tuple[int, ...]) -> int:
    """The root seed that, run sequentially, reproduces worker ``path`` of a multi-worker run."""
    return _as_int(np.random.SeedSequence(root, spawn_key=path + (1 << 20,)))


def seed_process(torch_seed: int) -> None:
    """Seed the global RNGs of this process (python, numpy legacy, torch)."""
    random.seed(torch_seed)
    np.random.seed(torch_seed)
    torch.manual_seed(torch_seed)


def write_seeds(path: Path, root: int, trees: dict[str, SeedTree], *, drawn: bool) -> None:
    data = {"root_seed": root, "drawn": drawn, "workers": {k: t.to_dict() for k, t in trees.items()}}
    path.write_text(json.dumps(data, indent=2) + "\n")


def capture_rng() -> dict:
    """RNG states as plain containers, so checkpoints load with ``torch.load(weights_only=True)``."""
    np_state = np.random.get_state(legacy=False)
    np_state["state"] = {"key": np_state["state"]["key"].tolist(), "pos": int(np_state["state"]["pos"])}
    py_version, py_internal, py_gauss = random.getstate()
    return {
        "python": {"version": py_version, "internal": list(py_internal), "gauss": py_gauss},
        "numpy": np_state,
        "torch": torch.get_rng_state(),
    }


def restore_rng(state: dict) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    np_state = dict(state["numpy"])
    np_state["state"] = {"key": np.asarray(np_state["state"]["key"], dtype=np.uint32), "pos": np_state["state"]["pos"]}
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"])
