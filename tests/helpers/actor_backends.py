"""One contract scenario for the two seams of ``trainer=subprocess_actors``, run against a real backend.

``python -m tests.helpers.actor_backends local|ray`` connects the backend (``ray``: a private Ray instance),
then through ``seams.ActorEvents`` and ``seams.WeightsTransport`` only: starts four actors (one echoes the
weights versions it reads and answers pings, one raises, one SIGKILLs itself, one hangs), publishes versions,
and prints one JSON line of what it saw (``CONTRACT=...``). ``tests/test_actors.py`` asserts the same contract
on both backends' lines.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rltrain.envs.make import EnvFactory
from rltrain.trainers.actors.backends import make_backend
from rltrain.trainers.actors.seams import ActorBackend, ActorEvents, WeightsHandle, WeightsReader, WeightsTransport
from rltrain.trainers.messages import Done, Exited, Failed, Started, Unresponsive
from rltrain.trainers.worker import WorkerContext

TIMEOUT_S = 4.0  # the backends' actor timeout: a hung actor is Unresponsive after this long
VERSIONS = 5


@dataclass(frozen=True)
class Job:
    handle: WeightsHandle


@dataclass(frozen=True)
class Ping:
    n: int


@dataclass(frozen=True)
class Finish:
    pass


@dataclass(frozen=True)
class Said:
    """actor -> learner: ``what`` happened (``hello``, ``pong``, ``seen``), with numbers."""

    index: int
    what: str
    values: tuple = ()


def echo(ctx: WorkerContext, job: Job) -> dict:
    """Reads every version it is handed (checking it is whole), answers pings, returns when asked."""
    reader = job.handle.attach()
    ctx.send(Said(ctx.index, "hello", (int(isinstance(reader, WeightsReader)),)))
    last, seen = -1, []
    while not ctx.stop_requested:
        msg = ctx.recv(0.01)
        while msg is not None:
            if isinstance(msg, Ping):
                ctx.send(Said(ctx.index, "pong", (msg.n,)))
            elif isinstance(msg, Finish):
                reader.close()
                return {"seen": seen}
            else:
                reader.receive(msg)
            msg = ctx.recv()
        update = reader.read_if_newer(last)
        if update is not None:
            last, state = update
            whole = float(state["w"].min()) == float(state["w"].max()) == float(last)
            seen.append(last)
            ctx.send(Said(ctx.index, "seen", (last, reader.env_steps, int(whole))))
    reader.close()
    return {"seen": seen}


def raising(ctx: WorkerContext, job: Job) -> None:
    ctx.send(Said(ctx.index, "hello"))
    raise RuntimeError("boom in the contract target")


def dying(ctx: WorkerContext, job: Job) -> None:
    ctx.send(Said(ctx.index, "hello"))
    time.sleep(0.5)  # its hello reaches the learner first
    os.kill(os.getpid(), signal.SIGKILL)


def hanging(ctx: WorkerContext, job: Job) -> None:
    ctx.send(Said(ctx.index, "hello"))
    time.sleep(600)  # never polls stop_requested: no progress, so no heartbeat


def _state(v: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((1000,), float(v)), "b": torch.zeros(3, dtype=torch.int64)}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def scenario(name: str) -> dict:
    backend = make_backend(name, ray={}, start_method="fork", num_actors=4, env=EnvFactory(id="CartPole-v1"))
    out: dict = {"backend_is_protocol": isinstance(backend, ActorBackend)}
    events = backend.connect(actor_timeout_s=TIMEOUT_S)
    weights = backend.weights(_state(0), version=0, env_steps=0)
    out.update(events_is_protocol=isinstance(events, ActorEvents),
               weights_is_protocol=isinstance(weights, WeightsTransport))
    try:
        index = {fn.__name__: events.start(fn, Job(weights.handle)) for fn in (echo, raising, dying, hanging)}
        name_of = {i: n for n, i in index.items()}
        got: dict[str, list] = {n: [] for n in index}
        published, pinged = 0, 0
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            for ev in events.poll(0.2):
                who = name_of[ev.index]
                got[who].append(ev)
                if isinstance(ev, Started):
                    where = events.placement(ev.index)
                    out[f"{who}_started"] = [ev.pid, where.pid if where is not None else None]
                if isinstance(ev, Unresponsive):
                    events.kill(ev.index)
            said = [e for e in got["echo"] if isinstance(e, Said)]
            seen = [e.values[0] for e in said if e.what == "seen"]
            if seen and seen[-1] == published < VERSIONS:  # caught up: the next version, one at a time
                published += 1
                weights.publish(_state(published), version=published, env_steps=10 * published)
            elif seen and seen[-1] == published == VERSIONS:  # then three at once: it reads the newest
                for v in range(VERSIONS + 1, VERSIONS + 4):
                    weights.publish(_state(v), version=v, env_steps=10 * v)
                published = VERSIONS + 3
                out["transport_version"] = weights.version
            if any(e.what == "hello" for e in said) and pinged < 3:
                pinged += 1
                out[f"send_ping_{pinged}"] = events.send(index["echo"], Ping(pinged))
            if seen and seen[-1] == VERSIONS + 3 and pinged == 3 and "send_finish" not in out:
                out["send_finish"] = events.send(index["echo"], Finish())
            ended = {n for n, evs in got.items() if any(isinstance(e, (Done, Failed, Exited, Unresponsive))
                                                          for e in evs)}
            if ended == set(index):
                break
        out["echo_said"] = [[e.what, *e.values] for e in got["echo"] if isinstance(e, Said)]
        done = [e for e in got["echo"] if isinstance(e, Done)]
        out["echo_done"] = done[0].result if done else None
        failed = [e for e in got["raising"] if isinstance(e, Failed)]
        out["raising_failed"] = [failed[0].error, "in raising" in failed[0].traceback] if failed else None
        exited = [e for e in got["dying"] if isinstance(e, Exited)]
        out["dying_exited"] = exited[0].description if exited else None
        silent = [e for e in got["hanging"] if isinstance(e, Unresponsive)]
        out["hanging_silent_s"] = silent[0].silent_s if silent else None
        out["send_to_ended"] = events.send(index["raising"], Ping(9))
    finally:
        weights.mark_closing()
        events.shutdown(grace_s=10.0, term_s=5.0)
        weights.close()
        backend.close()
    time.sleep(2.0)  # Ray ends a killed actor's process asynchronously
    out["alive_after_shutdown"] = sorted(k for k, v in out.items() if k.endswith("_started") and _alive(v[0]))
    return out


if __name__ == "__main__":
    torch.set_num_threads(1)
    print("CONTRACT=" + json.dumps(scenario(sys.argv[1])), flush=True)
