"""``trainer.backend=ray``: connect to (or start) the Ray instance and refuse what cannot work, in one line each.

``trainer.ray.address``: ``null`` starts a private Ray instance on this machine for the run (shut down with
it); ``auto`` joins the cluster this node joined with ``ray start`` (``RAY_ADDRESS`` or Ray's own record of
it); ``host:port`` is that cluster's head. Before anything else is made (no run directory is left behind),
``RayCluster.connect`` checks, each a ``ConfigError`` naming the fix, bounded in time:

- the head answers at all (a socket connect with a timeout: ``ray.init`` to a dead address retries for minutes);
- the token: a cluster started by ``ray start --head`` requires token authentication (rltrain never turns it
  off, nor on: a driver in token mode breaks its actors on a cluster without it); a joiner sets
  ``RAY_AUTH_MODE=token`` and the cluster's token (``RAY_AUTH_TOKEN`` or ``~/.ray/auth_token``); a missing or
  wrong one is named;
- some alive node has every resource of ``trainer.ray.actor_resources`` (e.g. ``num_gpus: 1`` on a CPU cluster);
- the env builds on a node that can host an actor (an env module the workers cannot import is named).

An env ``module:EnvId`` whose module lies beside the user (``env.search_path``, the launch directory) is
shipped to every node through Ray's ``runtime_env`` (``py_modules``), so the nodes need only rltrain installed.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rltrain.envs.make import EnvFactory
from rltrain.errors import ConfigError
from rltrain.run.signals import STOP_SIGNALS

RESERVED = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}  # actor_resources key -> Ray resource
# a node that has the resources (``_check_resources`` refuses the others at once) must start a worker process for
# the probe: tens of seconds on a loaded small machine (30 s proved too short beside other jobs on 2 cores)
PROBE_TIMEOUT_S = 120.0
PRIVATE_OBJECT_STORE_BYTES = 1 << 30  # a private instance's object store (Ray's default takes 30% of RAM)
HEAD_ANSWER_S = 10.0  # a head's GCS completes the gRPC (HTTP/2) handshake at once; another service never does
HEAD_LOST_AFTER = 3  # failed checks of the head's port in a row (one a second) that mean the head is gone


def ray_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return "trainer.backend=ray needs Ray: pip install 'rltrain[ray]' (or trainer.backend=local)"
    return None


def check_ray_settings(ray: dict) -> dict:
    """``trainer.ray`` validated: ``{address, actor_resources}``."""
    known = {"address", "actor_resources"}
    if set(ray) - known:
        raise ConfigError(f"trainer.ray: unknown keys {sorted(set(ray) - known)}; valid: {', '.join(sorted(known))}")
    address = ray.get("address")
    if address not in (None, "auto") and (not isinstance(address, str) or not _split(address)):
        raise ConfigError(f"trainer.ray.address={address!r} must be null (a private Ray instance), auto "
                          "(the cluster this node joined) or host:port of the cluster's head")
    resources = ray.get("actor_resources") or {}
    if not isinstance(resources, dict):
        raise ConfigError(f"trainer.ray.actor_resources={resources!r} must be a mapping, "
                          "e.g. '{num_cpus:1,actor_host:1}'")
    for key, value in resources.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"trainer.ray.actor_resources.{key}={value!r} must be a number >= 0")
    return {"address": address, "actor_resources": dict(resources)}


def _split(address: str) -> tuple[str, int] | None:
    host, _, port = address.rpartition(":")
    return (host, int(port)) if host and port.isdigit() and 0 < int(port) < 65536 else None


def actor_options(resources: dict) -> dict:
    """Ray actor options from ``trainer.ray.actor_resources``: any key but num_cpus/num_gpus/memory is custom."""
    custom = {k: float(v) for k, v in resources.items() if k not in RESERVED}
    opts = {k: v for k, v in resources.items() if k in RESERVED}
    opts.setdefault("num_cpus", 1)
    # spread the actors over the nodes that can take them (RLlib's env runners, Sample Factory's workers alike)
    return {**opts, **({"resources": custom} if custom else {}), "scheduling_strategy": "SPREAD"}


class RayCluster:
    """The connection of one run; ``close()`` disconnects (and stops a private instance)."""

    def __init__(self, *, address: str | None, actor_resources: dict, num_actors: int, env: EnvFactory):
        self.address, self.resources, self.num_actors, self.env = address, actor_resources, num_actors, env
        self.options = actor_options(actor_resources)
        self.private = address is None
        self.connected = False
        self._target: str | None = None  # the head's host:port once connected (None: a private instance)

    def connect(self) -> None:
        import ray

        target = self._target = self._head_address()
        # Ray's driver installs its own fatal-signal handlers (SIGTERM aborts the process): the run's stop flag
        # (checkpoint, then stop the actors) must keep them
        handlers = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        common = {"runtime_env": self.runtime_env(), "log_to_driver": False, "logging_level": logging.ERROR,
                  "configure_logging": True}
        try:
            if self.private:  # "local": a new instance, even where RAY_ADDRESS or a `ray start` names a cluster
                ray.init(address="local", include_dashboard=False, object_store_memory=PRIVATE_OBJECT_STORE_BYTES,
                         **self._private_resources(), **common)
            else:
                ray.init(address=target, **common)
        except ray.exceptions.AuthenticationError:
            raise ConfigError(f"the Ray cluster at {target} requires its authentication token and none was found: "
                              "copy it from the head (`ray get-auth-token`) into RAY_AUTH_TOKEN or "
                              "~/.ray/auth_token, with RAY_AUTH_MODE=token") from None
        except ConnectionError as err:
            given = _token_given()
            if given:  # Ray says why only in its own log lines (InvalidAuthToken): the token is the likely cause
                raise ConfigError(f"the Ray cluster at {target} refused the connection ({err}): the authentication "
                                  f"token from {given} is not this cluster's; copy the head's (`ray get-auth-token` "
                                  "on the head) into RAY_AUTH_TOKEN") from None
            raise ConfigError(f"the Ray cluster at {target} answered but refused the connection ({err}); a cluster "
                              "started with `ray start --head` needs its token: set RAY_AUTH_MODE=token and "
                              "RAY_AUTH_TOKEN to the head's `ray get-auth-token`") from None
        finally:
            for signum, handler in handlers.items():
                if handler is not None:
                    signal.signal(signum, handler)
        self.connected = True
        try:
            self._check_resources()
            self._probe_env()
        except BaseException:
            self.close()
            raise

    @property
    def head(self) -> str | None:
        """``host:port`` of the head of a cluster this run joined (None: a private instance, which dies with us)."""
        return self._target

    def watch_head(self, on_lost: Callable[[str], None]) -> None:
        """Call ``on_lost(why)`` (from a thread) once the head of a cluster we joined stops answering: its GCS
        port refuses ``HEAD_LOST_AFTER`` checks in a row, one a second."""
        target = self._target
        hp = _split(target.removeprefix("ray://")) if target else None
        if hp is None:
            return

        def watch() -> None:
            misses = 0
            while self.connected:
                time.sleep(1.0)
                try:
                    with socket.create_connection(hp, timeout=2.0):
                        misses = 0
                except OSError:
                    misses += 1
                if misses >= HEAD_LOST_AFTER and self.connected:
                    on_lost(f"the Ray head at {target} stopped answering (lost: its node died or was stopped)")
                    return

        threading.Thread(target=watch, name="rltrain-ray-head", daemon=True).start()

    def _head_address(self) -> str | None:
        if self.private:
            return None
        address = self.address
        if address == "auto":
            address = os.environ.get("RAY_ADDRESS") or _recorded_cluster()
            if not address:
                raise ConfigError("trainer.ray.address=auto: this node joined no Ray cluster (no RAY_ADDRESS, no "
                                  "`ray start` record); run `ray start --head` (or `ray start --address=HEAD`) "
                                  "first, or give trainer.ray.address=host:port")
        hp = _split(address.removeprefix("ray://"))
        if hp is None:
            raise ConfigError(f"trainer.ray.address: {address!r} is not host:port")
        try:
            with socket.create_connection(hp, timeout=5.0):
                pass
        except OSError as err:
            raise ConfigError(f"cannot reach the Ray head at {address} ({err.strerror or err}); start it there with "
                              "`ray start --head --port=PORT` or fix trainer.ray.address") from None
        if not answers_grpc(hp, HEAD_ANSWER_S):  # ray.init would retry a port that is not a head's for minutes
            raise ConfigError(f"{address} accepts connections but is not a Ray head (no gRPC answer within "
                              f"{HEAD_ANSWER_S:g}s): trainer.ray.address takes the head's GCS port (`ray start "
                              "--head --port=PORT`, 6379 by default)")
        return address

    def _private_resources(self) -> dict:
        # like local actor processes, a private instance's actors share this machine's cores: advertise enough
        # CPUs (and custom resources) for all of them, so the run is placed as the local backend would be
        per_cpu = float(self.options.get("num_cpus", 1))
        cpus = max(os.cpu_count() or 1, int(per_cpu * self.num_actors + 0.999) + 1)
        custom = {k: v * self.num_actors for k, v in self.options.get("resources", {}).items()}
        return {"num_cpus": cpus, **({"resources": custom} if custom else {})}

    @property
    def bundle(self) -> dict[str, float]:
        """One actor's resources under Ray's names (its placement group's bundle; zeros left out)."""
        need = {RESERVED.get(k, k): float(v) for k, v in self.resources.items()}
        need.setdefault("CPU", float(self.options["num_cpus"]))
        return {k: v for k, v in need.items() if v > 0}

    def _check_resources(self) -> None:
        import ray

        need = self.bundle
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if any(all(n["Resources"].get(k, 0.0) >= v for k, v in need.items()) for n in nodes):
            return
        have = sorted({k for n in nodes for k in n["Resources"] if not k.startswith("node:")})
        wanted = ", ".join(f"{k}: {v:g}" for k, v in need.items())
        raise ConfigError(f"trainer.ray.actor_resources asks for {{{wanted}}} per actor, which no node of the Ray "
                          f"cluster has (its {len(nodes)} node(s) offer: {', '.join(have)}); lower it or add a "
                          "node that has it (`ray start --resources=...`)")

    def _probe_env(self) -> None:
        """Build one env where an actor would run: a module the nodes cannot import fails here, in one line."""
        import ray

        probe = ray.remote(_probe).options(max_retries=0, **{k: v for k, v in self.options.items()
                                                             if k != "scheduling_strategy"})
        ref = probe.remote(self.env)
        try:
            ray.get(ref, timeout=PROBE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            raise ConfigError(f"no Ray node with {self.resources or 'one CPU'} free took a probe task within "
                              f"{PROBE_TIMEOUT_S:g}s: the nodes that have them are busy with other work; free "
                              "them or add a node") from None
        except ray.exceptions.RayError as err:
            cause = getattr(err, "cause", None) or err
            raise ConfigError(f"the env cannot be built on the Ray worker nodes: {cause}; install what it needs on "
                              "every node, or keep its module beside you (shipped through runtime_env)") from None

    def runtime_env(self) -> dict:
        """``py_modules``: the env module when it lies in the launch directory (``env.search_path``)."""
        if ":" not in self.env.id or not self.env.search_path:
            return {}
        top = self.env.id.split(":", 1)[0].split(".")[0]
        base = Path(self.env.search_path)
        for candidate in (base / f"{top}.py", base / top):
            if candidate.is_file() or (candidate / "__init__.py").is_file():
                return {"py_modules": [str(candidate)]}
        return {}

    def close(self) -> None:
        """Disconnect; for a private instance this also stops its processes (Ray started them for us)."""
        if self.connected:
            import ray

            ray.shutdown()
            self.connected = False


def answers_grpc(hp: tuple[str, int], timeout_s: float) -> bool:
    """Whether ``host:port`` completes a gRPC channel's handshake (HTTP/2) within ``timeout_s``: what a Ray head's
    GCS does at once, and a server of anything else (or a silent one) never does. Needs no token."""
    import grpc  # a dependency of Ray

    channel = grpc.insecure_channel(f"{hp[0]}:{hp[1]}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def _token_given() -> str | None:
    """Where this driver's token comes from (Ray's order: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token),
    or None when it has none or is not in token mode."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return None
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return f"RAY_AUTH_TOKEN_PATH ({path})" if Path(path).is_file() else None
    return "~/.ray/auth_token" if (Path.home() / ".ray" / "auth_token").is_file() else None


def _recorded_cluster() -> str | None:
    path = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "ray_current_cluster"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _probe(env: EnvFactory) -> str:
    import socket as _socket

    env.make().close()
    return _socket.gethostname()
