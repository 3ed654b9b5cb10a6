"""The Ray weights transport of ``trainer=subprocess_actors`` (``trainer.backend=ray``): publish / read-if-newer.

The same two sides as ``shared_weights.SharedWeights`` (``seams.WeightsTransport`` / ``WeightsReader``), across
machines:

- the learner ``publish``es a version once: ``ray.put`` of the flattened ``policy_state()`` as numpy arrays
  (one object; Ray copies it at most once to each node that asks, and the actors of a node share that copy),
  then ``announce``s a small ``WeightsNote`` (version, learner env steps, the object's reference nested in a
  list, so Ray does not fetch it on delivery) to every live actor. ``announce`` is the event source's public
  ``RayGroup.broadcast``, handed over by the backend: the notes ride the actors' message stream, in order with
  the learner's credits and its stop;
- an actor's reader keeps only the newest note it was handed (``receive``, from its actor loop) and
  ``ray.get``s the weights only when that version is newer than the one it acts with (``read_if_newer``): a slow
  actor that was handed ten versions while it collected fetches one.

The note current at an actor's start travels in its handle (``ActorSpec.weights``), so a restarted actor never
acts with weights older than the version current at its start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy and torch load with the actor's target, not with its host (placement is seen sooner)
    import torch


@dataclass(frozen=True)
class WeightsNote:
    """learner -> actor: version ``version`` is out; ``refs[0]`` is its object (nested: not fetched on delivery)."""

    version: int
    env_steps: int
    refs: list = field(repr=False)


@dataclass(frozen=True)
class RayWeightsHandle:
    """What ``ActorSpec.weights`` carries under the Ray backend: the note current at the actor's start."""

    note: WeightsNote

    def attach(self) -> RayWeightsReader:
        return RayWeightsReader(self.note)


class RayWeightsReader:
    """The actor's side: the newest note it was handed, fetched when the actor asks for a newer version."""

    def __init__(self, note: WeightsNote):
        self.note = note

    @property
    def env_steps(self) -> int:
        return self.note.env_steps

    @property
    def closing(self) -> bool:
        return False  # the group's Stop arrives through the same stream as any closing word would

    def receive(self, msg: Any) -> None:
        # the host runs several deliveries at once (a threaded actor): notes may arrive out of order
        if isinstance(msg, WeightsNote) and msg.version >= self.note.version:
            self.note = msg

    def read_if_newer(self, last_version: int) -> tuple[int, dict[str, torch.Tensor]] | None:
        note = self.note
        if note.version == last_version:
            return None
        import numpy as np
        import ray
        import torch

        arrays = ray.get(note.refs[0])  # read-only views of this node's copy: load_state_dict copies them out
        return note.version, {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}

    def close(self) -> None:
        pass  # nothing mapped: the objects belong to the learner


class RayWeights:
    """The learner's side. ``announce(note)`` hands a note to every live actor (``RayGroup.broadcast``)."""

    def __init__(self, state: dict[str, torch.Tensor], *, version: int, env_steps: int,
                 announce: Callable[[WeightsNote], None]):
        self._announce = announce
        self._note: WeightsNote | None = None
        self.publish(state, version=version, env_steps=env_steps)

    @property
    def handle(self) -> RayWeightsHandle:
        assert self._note is not None, "closed"
        return RayWeightsHandle(self._note)

    @property
    def version(self) -> int:
        assert self._note is not None, "closed"
        return self._note.version

    def publish(self, state: dict[str, torch.Tensor], *, version: int, env_steps: int) -> None:
        import ray

        arrays = {k: v.detach().cpu().numpy() for k, v in state.items()}
        self._note = WeightsNote(version, env_steps, [ray.put(arrays)])  # the previous object goes with its note
        self._announce(self._note)

    def mark_closing(self) -> None:
        pass  # nothing faster than the group's Stop, which follows on the same stream

    def close(self) -> None:
        self._note = None
