"""The Ray weights transport of ``trainer=subprocess_actors`` (``trainer.backend=ray``): publish / read-if-newer.

The same two sides as ``shared_weights.SharedWeights``, across machines:

- the learner ``publish``es a version once: ``ray.put`` of the flattened ``policy_state()`` as numpy arrays
  (one object; Ray copies it at most once to each node that asks, and the actors of a node share that copy),
  then hands every live actor a small ``WeightsNote`` (version, learner env steps, the object's reference
  nested in a list, so Ray does not fetch it on delivery);
- an actor's reader keeps only the newest note it was handed and ``ray.get``s the weights only when that
  version is newer than the one it acts with (``read_if_newer``): a slow actor that was handed ten versions
  while it collected fetches one.

Notes reach an actor through its host's mailbox (``ray_actors.ActorHost.deliver``), in the same call stream as
the learner's credits and its stop; the first note travels with the actor's start, so a restarted actor never
acts with weights older than the version current at its start.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy and torch load with the actor's target, not with its host (placement is seen sooner)
    import torch


@dataclass(frozen=True)
class WeightsNote:
    """learner -> actor: version ``version`` is out; ``refs[0]`` is its object (nested: not fetched on delivery)."""

    version: int
    env_steps: int
    refs: list = field(repr=False)


@dataclass
class Closing:
    """learner -> actor: the run is ending (the reader's ``closing`` turns true, as the shared block's flag)."""


class Mailbox:
    """Actor side: the newest note and the closing flag, written by the host's ``deliver`` thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.note: WeightsNote | None = None
        self.closing = False

    def offer(self, note: WeightsNote) -> None:
        with self._lock:  # deliveries may run concurrently (a threaded actor): keep the newest only
            if self.note is None or note.version >= self.note.version:
                self.note = note


_MAILBOX = Mailbox()  # one actor per Ray worker process: its host and its reader meet here


@dataclass(frozen=True)
class RayWeightsHandle:
    """What ``ActorSpec.weights`` carries under the Ray backend; ``attach()`` gives the actor's reader."""

    def attach(self) -> RayWeightsReader:
        return RayWeightsReader(_MAILBOX)


class RayWeightsReader:
    """The actor's side, with ``SharedWeights``' reader interface (``read_if_newer``, ``env_steps``, ``closing``)."""

    def __init__(self, mailbox: Mailbox):
        self.mailbox = mailbox

    @property
    def version(self) -> int:
        note = self.mailbox.note
        return note.version if note else -1

    @property
    def env_steps(self) -> int:
        note = self.mailbox.note
        return note.env_steps if note else 0

    @property
    def closing(self) -> bool:
        return self.mailbox.closing

    def read_if_newer(self, last_version: int) -> tuple[int, dict[str, torch.Tensor]] | None:
        note = self.mailbox.note
        if note is None or note.version == last_version:
            return None
        import numpy as np
        import ray
        import torch

        arrays = ray.get(note.refs[0])  # read-only views of this node's copy: load_state_dict copies them out
        return note.version, {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}

    def close(self) -> None:
        pass  # nothing mapped: the objects belong to the learner


class RayWeights:
    """The learner's side, with ``SharedWeights``' writer interface (``publish``, ``mark_closing``, ``close``).

    ``broadcast`` is the event source's (``ray_actors.RayGroup.broadcast``): it hands a message to every live
    actor; the group asks ``note`` for the current version when it starts an actor."""

    def __init__(self, state: dict[str, torch.Tensor], *, version: int, env_steps: int):
        self.handle = RayWeightsHandle()
        self.broadcast: Callable[[object], None] | None = None
        self.note: WeightsNote | None = None
        self.publish(state, version=version, env_steps=env_steps)

    def publish(self, state: dict[str, torch.Tensor], *, version: int, env_steps: int) -> None:
        import ray

        arrays = {k: v.detach().cpu().numpy() for k, v in state.items()}
        self.note = WeightsNote(version, env_steps, [ray.put(arrays)])  # the previous object is freed with its note
        if self.broadcast is not None:
            self.broadcast(self.note)

    def set_env_steps(self, env_steps: int) -> None:
        assert self.note is not None
        self.note = WeightsNote(self.note.version, env_steps, self.note.refs)
        if self.broadcast is not None:
            self.broadcast(self.note)

    def mark_closing(self) -> None:
        if self.broadcast is not None:
            self.broadcast(Closing())

    def close(self) -> None:
        self.note = None
