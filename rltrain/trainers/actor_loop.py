"""The actor process of ``trainer=subprocess_actors``: collect with a copy of the policy, send rollouts.

An actor builds its envs and a policy-only copy of the algorithm, attaches the learner's shared weights
and loops: reload weights when the version moved, collect ``rollout_len`` steps with the shared
``RolloutCollector`` (so a transition is exactly what the sequential trainer records, tagged with the
policy version that chose it), send it to the learner through its own pipe. One pipe per actor, not one
shared ``multiprocessing.Queue``: an actor SIGKILLed while holding a shared queue's lock would wedge
every other actor; a dead pipe only costs its own actor. The bounded queue lives in the learner, which
reads a pipe only while its queue has room, so a full queue blocks the actors' sends (backpressure).

Messages are typed dataclasses. Everything an actor needs arrives in one picklable ``ActorSpec`` made of
plain containers (no DictConfig), so fork, forkserver and spawn all work.
"""

from __future__ import annotations

import pickle
import signal
import threading
import time
import traceback
import zlib
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import torch

from rltrain.seeding import SeedTree, seed_process
from rltrain.trainers.shm_weights import SharedWeights, WeightsHandle
from rltrain.types import Rollout

HEARTBEAT_S = 1.0  # an idle or busy actor still sends a heartbeat this often


# -- messages -----------------------------------------------------------------------------------------------
@dataclass
class ActorSpec:
    """Start-up data for one actor (generation = how many times this actor slot was (re)started)."""

    actor_id: int
    generation: int
    seeds: SeedTree
    algo_cfg: dict  # cfg["algo"], plain
    env_cfg: dict  # cfg["env"], plain
    num_envs: int
    rollout_len: int
    weights: WeightsHandle
    device: str = "cpu"
    sync: bool = False
    share: int = 1  # sync mode: rollouts to deliver per policy version
    compress: str = "none"
    torch_threads: int = 1
    credits: int = 1  # rollouts it may have in flight (in its pipe or the learner's queue)


@dataclass
class Hello:
    actor_id: int
    generation: int
    pid: int


@dataclass
class Heartbeat:
    actor_id: int
    generation: int
    sent_at: float


@dataclass
class RolloutMsg:
    """One rollout; ``payload`` is the Rollout itself or its compressed pickle (``codec`` lz4/zlib)."""

    actor_id: int
    generation: int
    version: int  # policy version that produced every step of it
    num_steps: int
    collect_s: float  # seconds the actor spent collecting it (actor SPS = num_steps / collect_s)
    episodes: int  # the actor's finished episodes so far
    codec: str
    payload: object = field(repr=False)

    def rollout(self) -> Rollout:
        return decode(self.payload, self.codec)


@dataclass
class ActorFailed:
    actor_id: int
    generation: int
    traceback: str


@dataclass
class Stop:
    reason: str = "shutdown"


@dataclass
class Credit:
    """The learner took ``n`` of this actor's rollouts out of its queue: it may send ``n`` more."""

    n: int = 1


# -- payload compression ------------------------------------------------------------------------------------
def encode(rollout: Rollout, codec: str) -> object:
    """Compress only what crosses the pipe; ``none`` lets the pipe pickle the arrays directly."""
    if codec == "none":
        return rollout
    raw = pickle.dumps(rollout, protocol=pickle.HIGHEST_PROTOCOL)
    if codec == "zlib":
        return zlib.compress(raw, 1)
    if codec == "lz4":
        import lz4.frame

        return lz4.frame.compress(raw)
    raise ValueError(f"unknown codec {codec!r}")


def decode(payload: object, codec: str) -> Rollout:
    if codec == "none":
        return payload  # type: ignore[return-value]
    if codec == "zlib":
        return pickle.loads(zlib.decompress(payload))  # type: ignore[arg-type]
    import lz4.frame

    return pickle.loads(lz4.frame.decompress(payload))  # type: ignore[arg-type]


# -- the process ---------------------------------------------------------------------------------------------
def actor_main(spec: ActorSpec, conn: Connection) -> None:
    """Process entry point. Any exception is sent to the learner with its traceback, then exit code 1."""
    # Ctrl-C reaches the whole process group; the learner decides when actors stop (it checkpoints first).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(spec.torch_threads)
    send_lock = threading.Lock()
    try:
        _ActorLoop(spec, conn, send_lock).run()
    except (BrokenPipeError, EOFError, ConnectionResetError):
        return  # the learner is gone: nothing to report to
    except BaseException:
        try:
            with send_lock:
                conn.send(ActorFailed(spec.actor_id, spec.generation, traceback.format_exc()))
        except OSError:
            pass
        raise SystemExit(1) from None


class _ActorLoop:
    def __init__(self, spec: ActorSpec, conn: Connection, send_lock: threading.Lock):
        from rltrain.build import algo_factory
        from rltrain.collect import RolloutCollector
        from rltrain.envs import env_spec, make_env, make_vector_env

        self.spec, self.conn, self.send_lock = spec, conn, send_lock
        seed_process(spec.seeds.torch_seed)
        env = spec.env_cfg
        kwargs, max_steps = dict(env.get("kwargs") or {}), env.get("max_episode_steps")
        espec = env_spec(make_env(env["id"], kwargs, max_episode_steps=max_steps), env["id"])
        device = torch.device(spec.device)
        self.algo = algo_factory({"algo": spec.algo_cfg})(espec, num_envs=spec.num_envs, device=device)
        self.weights = SharedWeights.attach(spec.weights)
        self.version = -1
        self._reload()
        venv = make_vector_env(env["id"], spec.num_envs, spec.seeds.env_seeds, kwargs=kwargs,
                               max_episode_steps=max_steps, vectorization=env.get("vectorization", "sync"))
        self.collector = RolloutCollector(venv, self.algo.policy, espec, device=device)
        self.stopped = threading.Event()

    def _reload(self) -> bool:
        update = self.weights.read_if_newer(self.version)
        if update is None:
            return False
        self.version, state = update
        self.algo.policy.load_state_dict(state)
        return True

    def _send(self, msg: object) -> None:
        with self.send_lock:
            self.conn.send(msg)

    def _heartbeats(self) -> None:
        # Skips a beat while the main thread is inside a send (blocked by backpressure): the learner
        # judges heartbeats only while its queue has room, i.e. while it is reading.
        while not self.stopped.wait(HEARTBEAT_S):
            if self.send_lock.acquire(blocking=False):
                try:
                    self.conn.send(Heartbeat(self.spec.actor_id, self.spec.generation, time.time()))
                except OSError:
                    return
                finally:
                    self.send_lock.release()

    def _should_stop(self, wait_s: float = 0.0) -> bool:
        """Reads the learner's messages (credits, stop); EOFError (learner gone) propagates: exit quietly."""
        if self.weights.closing:
            return True
        while self.conn.poll(wait_s):
            msg = self.conn.recv()
            if isinstance(msg, Stop):
                return True
            if isinstance(msg, Credit):
                self.credits += msg.n
            wait_s = 0.0
        return False

    def run(self) -> None:
        spec = self.spec
        self._send(Hello(spec.actor_id, spec.generation, _pid()))
        beat = threading.Thread(target=self._heartbeats, name="heartbeat", daemon=True)
        beat.start()
        produced = 0  # rollouts sent with the current version (sync mode delivers `share` per version)
        self.credits = spec.credits
        try:
            while not self._should_stop():
                if self._reload():
                    produced = 0
                if spec.sync and produced >= spec.share:
                    time.sleep(0.001)  # wait for the learner's next version
                    continue
                if self.credits <= 0:  # the learner's queue holds enough of ours: backpressure
                    if self._should_stop(wait_s=0.05):
                        break
                    continue
                random = self.algo.wants_random_actions(self.weights.env_steps)
                t0 = time.perf_counter()
                rollout = self.collector.collect(spec.rollout_len, policy_version=self.version,
                                                 random_actions=random)
                collect_s = time.perf_counter() - t0
                self._send(RolloutMsg(spec.actor_id, spec.generation, self.version, rollout.num_steps, collect_s,
                                      self.collector.episodes, spec.compress, encode(rollout, spec.compress)))
                produced += 1
                self.credits -= 1
        finally:
            self.stopped.set()
            self.collector.venv.close()
            self.weights.close()


def _pid() -> int:
    import os

    return os.getpid()
