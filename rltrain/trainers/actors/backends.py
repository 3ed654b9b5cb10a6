"""Where the actors of ``trainer=subprocess_actors`` run: ``trainer.backend: local | ray``.

A backend (``seams.ActorBackend``) connects and supplies the pool's two seams, nothing else: the event source
(``seams.ActorEvents``) and the weights transport (``seams.WeightsTransport``). The pool, the learner, the loop
and the algorithms are the same code for both.

- ``local``: actor processes on this machine (``supervise.WorkerGroup``), weights in one shared-memory block
  (``shared_weights.py``); Ray is never imported.
- ``ray``: Ray actors on the nodes of a Ray cluster (``ray_actors.py``), weights through the object store
  (``ray_weights.py``), the connection and its checks in ``ray_cluster.py``; Ray is imported only here, and only
  when this backend is chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rltrain.envs.make import EnvFactory
from rltrain.errors import ConfigError
from rltrain.trainers.actors.shared_weights import SharedWeights
from rltrain.trainers.supervise import WorkerGroup

if TYPE_CHECKING:
    import torch

    from rltrain.trainers.actors.ray_actors import RayGroup
    from rltrain.trainers.actors.ray_watch import RunWatcher
    from rltrain.trainers.actors.ray_weights import RayWeights

BACKENDS = ("local", "ray")


class LocalBackend:
    name = "local"

    def __init__(self, *, start_method: str):
        self.start_method = start_method

    def connect(self, *, actor_timeout_s: float, on_lost: Callable[[str], None] | None = None,
                run_dir: Path | None = None) -> WorkerGroup:
        # daemon=False: an actor may start env processes of its own (env.vectorization=async); this machine is
        # never lost under its own run (on_lost is never called)
        return WorkerGroup(start_method=self.start_method, heartbeat_s=1.0, heartbeat_timeout_s=actor_timeout_s,
                           name="rltrain-actor", daemon=False)

    def weights(self, state: dict[str, torch.Tensor], *, version: int, env_steps: int) -> SharedWeights:
        return SharedWeights.create(state, version=version, env_steps=env_steps)

    def close(self) -> None:
        pass  # the pool stopped the processes and unlinked the block


class RayBackend:
    name = "ray"

    def __init__(self, *, ray: dict, num_actors: int, env: EnvFactory):
        from rltrain.trainers.actors.ray_cluster import RayCluster, check_ray_settings, ray_missing

        missing = ray_missing()
        if missing:
            raise ConfigError(missing)
        self.settings = check_ray_settings(ray)
        self.cluster = RayCluster(address=self.settings["address"], actor_resources=self.settings["actor_resources"],
                                  num_actors=num_actors, env=env)
        self.group: RayGroup | None = None
        self.watcher: RunWatcher | None = None

    def connect(self, *, actor_timeout_s: float, on_lost: Callable[[str], None] | None = None,
                run_dir: Path | None = None) -> RayGroup:
        from rltrain.trainers.actors.ray_actors import RayGroup
        from rltrain.trainers.actors.ray_watch import RunWatcher

        self.cluster.connect()
        head = self.cluster.head
        if head is not None:  # a cluster we joined: its head can be lost under the run
            if on_lost is not None:
                self.cluster.watch_head(on_lost)
            if run_dir is not None:  # Ray may end this process without a word: a watcher records the end
                self.watcher = RunWatcher(run_dir, head)
        self.group = RayGroup(options=self.cluster.options, bundle=self.cluster.bundle,
                              heartbeat_timeout_s=actor_timeout_s)
        return self.group

    def weights(self, state: dict[str, torch.Tensor], *, version: int, env_steps: int) -> RayWeights:
        from rltrain.trainers.actors.ray_weights import RayWeights

        assert self.group is not None, "connect() first"
        # the notes of new versions ride the actors' message stream: the group's public broadcast
        return RayWeights(state, version=version, env_steps=env_steps, announce=self.group.broadcast)

    def close(self) -> None:
        self.cluster.close()
        if self.watcher is not None:  # the run ended by itself: the watcher has nothing to record
            self.watcher.done()
            self.watcher = None


def make_backend(name: str, *, ray: dict | None, start_method: str, num_actors: int,
                 env: EnvFactory) -> LocalBackend | RayBackend:
    if name not in BACKENDS:
        raise ConfigError(f"trainer.backend={name!r} is not one of: {', '.join(BACKENDS)}")
    if name == "local":
        return LocalBackend(start_method=start_method)
    return RayBackend(ray=dict(ray or {}), num_actors=num_actors, env=env)
