"""The local weights transport (``seams.WeightsTransport`` / ``WeightsReader``): policy weights broadcast
through one shared-memory block with a version counter.

The learner owns the block: it creates it, ``publish``es a flattened ``policy_state()`` after every
update, and closes and unlinks it at shutdown. Actors ``attach`` by name and copy the weights out only
when the version has moved, so a broadcast costs one memcpy per actor per *new* version instead of a
pickle per poll (Maze re-pickles the whole state through a Manager proxy on every check).

Consistency uses a seqlock instead of a lock: the writer makes the sequence number odd, writes, then
makes it even again; a reader retries when it saw an odd number or the number changed under it. Readers
never block the writer, so an actor killed mid-read (SIGKILL) cannot wedge the learner, which a held
``multiprocessing.Lock`` would. Leaks: the block is registered with multiprocessing's resource tracker
at creation (attaching processes register the same name again, a no-op in the tracker's set), so even a
SIGKILLed learner's block is unlinked when the tracker notices the learner is gone.

Header (int64): [0] sequence, [1] policy version, [2] learner env steps, [3] closing flag.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np
import torch

_HEADER = 8  # int64 slots; 4 used, the rest reserved
_ALIGN = 64  # cache-line alignment of every tensor


@dataclass(frozen=True)
class WeightsHandle:
    """Everything an actor needs to attach: picklable, crosses fork/forkserver/spawn."""

    name: str
    nbytes: int
    layout: tuple[tuple[str, tuple[int, ...], str, int], ...]  # (key, shape, numpy dtype, byte offset)

    def attach(self) -> SharedWeights:
        """The actor's reader (each weights transport's handle attaches its own kind)."""
        return SharedWeights.attach(self)


def _layout(state: dict[str, torch.Tensor]) -> tuple[tuple[tuple[str, tuple[int, ...], str, int], ...], int]:
    offset = _HEADER * 8
    entries = []
    for key, tensor in state.items():
        arr = tensor.detach().cpu().numpy()
        offset = -(-offset // _ALIGN) * _ALIGN
        entries.append((key, tuple(arr.shape), arr.dtype.str, offset))
        offset += arr.nbytes
    return tuple(entries), max(offset, 1)


class SharedWeights:
    """One writer (the learner, ``create``) and any number of readers (actors, ``attach``)."""

    handle: WeightsHandle  # what an actor attaches to: the block's name and layout

    def __init__(self, shm: shared_memory.SharedMemory, handle: WeightsHandle, *, owner: bool):
        self._shm, self.handle, self.owner = shm, handle, owner
        self._header = np.ndarray((_HEADER,), np.int64, buffer=shm.buf)
        if owner:  # a new block: sequence even, not closing
            self._header[:] = 0
        self._views = {key: np.ndarray(shape, np.dtype(dt), buffer=shm.buf, offset=off)
                       for key, shape, dt, off in handle.layout}
        self._closed = False

    # -- construction ---------------------------------------------------------------------------------
    @classmethod
    def create(cls, state: dict[str, torch.Tensor], *, version: int = 0, env_steps: int = 0) -> SharedWeights:
        """Allocate a block shaped like ``state`` and publish ``state`` as ``version``."""
        layout, nbytes = _layout(state)
        shm = shared_memory.SharedMemory(create=True, size=nbytes)
        weights = cls(shm, WeightsHandle(shm.name, nbytes, layout), owner=True)
        weights.publish(state, version=version, env_steps=env_steps)
        return weights

    @classmethod
    def attach(cls, handle: WeightsHandle) -> SharedWeights:
        return cls(shared_memory.SharedMemory(name=handle.name, create=False), handle, owner=False)

    # -- writer -----------------------------------------------------------------------------------------
    def publish(self, state: dict[str, torch.Tensor], *, version: int, env_steps: int) -> None:
        """Copy ``state`` in and move the version (learner only)."""
        assert self.owner, "only the learner publishes"
        h = self._header
        h[0] += 1  # odd: write in progress
        for key, view in self._views.items():
            view[...] = state[key].detach().cpu().numpy()
        h[1], h[2] = version, env_steps
        h[0] += 1  # even: consistent again

    def mark_closing(self) -> None:
        """Tell every actor to stop (seen at its next check even if its pipe is blocked)."""
        self._header[3] = 1

    # -- readers ----------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return int(self._header[1])

    @property
    def env_steps(self) -> int:
        return int(self._header[2])

    @property
    def closing(self) -> bool:
        return bool(self._header[3])

    def read(self, *, timeout_s: float = 10.0) -> tuple[int, dict[str, torch.Tensor]]:
        """A consistent snapshot ``(version, state)``; raises TimeoutError if the writer died mid-write."""
        h = self._header
        deadline = time.monotonic() + timeout_s
        while True:
            seq = int(h[0])
            if seq % 2 == 0:
                version = int(h[1])
                state = {k: torch.from_numpy(v.copy()) for k, v in self._views.items()}
                if int(h[0]) == seq:
                    return version, state
            if time.monotonic() > deadline:
                raise TimeoutError("shared weights stayed mid-write: the learner died while publishing")
            time.sleep(0.0005)

    def read_if_newer(self, last_version: int) -> tuple[int, dict[str, torch.Tensor]] | None:
        """``read()`` only when the version moved past ``last_version`` (the cheap common case is a no-op)."""
        if int(self._header[1]) == last_version and int(self._header[0]) % 2 == 0:
            return None
        version, state = self.read()
        return None if version == last_version else (version, state)

    def receive(self, msg: object) -> None:
        """Nothing of this transport rides the actor's messages: the block is its channel."""

    # -- teardown ---------------------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap; the owner also unlinks (removes ``/dev/shm/<name>``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._views.clear()
        del self._header
        self._shm.close()
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()

    def __enter__(self) -> SharedWeights:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
