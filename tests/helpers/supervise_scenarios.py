"""Scenarios for ``rltrain.trainers.supervise``, run as ``python -m tests.helpers.supervise_scenarios NAME``.

They run in a subprocess of the test (not inside pytest) because spawn/forkserver start helper processes
(resource tracker, fork server) that live as long as their parent: the test then checks that nothing at
all is left behind once the scenario's process has exited. The last stdout line is a JSON report.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rltrain.trainers.supervise import Done, Exited, Failed, Started, Unresponsive, WorkerGroup

IMPORTED_IN = os.getpid()  # the process that ran this module's import: the worker itself, or the fork server


@dataclass(frozen=True)
class Tick:
    index: int
    n: int
    pid: int


def counting(ctx, n: int) -> dict:
    for i in range(n):
        ctx.send(Tick(ctx.index, i, os.getpid()))
    return {"index": ctx.index, "sum": sum(range(n))}


def raising(ctx, n: int) -> None:
    ctx.send(Tick(ctx.index, 0, os.getpid()))
    raise RuntimeError(f"boom in worker {ctx.index} after {n}")


def until_stopped(ctx, _: int) -> dict:
    ctx.send(Tick(ctx.index, 0, os.getpid()))
    while not ctx.wait_stop(0.05):
        pass
    return {"stopped": ctx.stop_reason}


@dataclass(frozen=True)
class Frames:
    data: bytes


def flooding(ctx, returned_dir: str) -> dict:
    """Sends messages larger than a pipe's buffer until stopped, as an actor sends rollouts of image frames: each
    send blocks until the parent reads, so it sees the ``Stop`` only if the parent keeps reading. Leaves a file
    in ``returned_dir`` when it returns (a SIGKILL leaves none)."""
    ctx.send(Tick(ctx.index, 0, os.getpid()))
    sent = 0
    while not ctx.stop_requested:
        ctx.send(Frames(bytes(1 << 20)))
        sent += 1
    Path(returned_dir, f"worker-{ctx.index}").touch()
    return {"sent": sent}


def stubborn(ctx, _: int) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ignores Stop and SIGTERM: only SIGKILL ends it
    ctx.send(Tick(ctx.index, 0, os.getpid()))
    while True:
        time.sleep(0.1)


def stuck(ctx, _: int) -> None:
    """A loop stuck in one call (its heartbeat thread is alive and well): it must go silent."""
    ctx.send(Tick(ctx.index, 0, os.getpid()))
    time.sleep(60)


def polling(ctx, _: int) -> dict:
    """A slow but live loop: polls its stop flag (its progress) while the seconds pass."""
    ctx.send(Tick(ctx.index, 0, os.getpid()))
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline and not ctx.stop_requested:
        time.sleep(0.1)
    return {"polled": True}


def imports(ctx, _: int) -> dict:
    """Where this worker's modules came from: nothing in its own chain of imports loads torch."""
    return {"pid": os.getpid(), "module_imported_in": IMPORTED_IN, "torch_loaded": "torch" in sys.modules}


def with_child(ctx, _: int) -> dict:
    """Starts a process of its own, as a worker with ``env.vectorization=async`` does."""
    import multiprocessing as mp

    child = mp.get_context("fork").Process(target=os.getpid)
    child.start()
    child.join(10)
    return {"child_exitcode": child.exitcode}


def run(name: str, method: str) -> dict:
    report: dict = {"events": [], "pids": [], "parent": os.getpid()}
    returned_dir = tempfile.mkdtemp(prefix="rltrain-flood-")
    # the targets by their module's real name, not ``__main__``: the fork server can preload that module
    me = importlib.import_module("tests.helpers.supervise_scenarios")
    target, payload = {"ok": (me.counting, 5), "raise": (me.raising, 3), "sigkill": (me.until_stopped, 0),
                       "stop": (me.until_stopped, 0), "stubborn": (me.stubborn, 0), "imports": (me.imports, 0),
                       "child": (me.with_child, 0), "child_of_daemon": (me.with_child, 0),
                       "stuck": (me.stuck, 0), "polling": (me.polling, 0), "flood": (me.flooding, returned_dir)}[name]
    t0 = time.monotonic()
    silent_after = 1.5 if name in ("stuck", "polling") else 60.0
    with WorkerGroup(start_method=method, heartbeat_s=0.2, heartbeat_timeout_s=silent_after,
                     daemon=name != "child") as group:
        for _ in range(2):
            group.start(target, payload)
        stopped = False
        while group.alive and time.monotonic() - t0 < 60:
            for ev in group.poll(timeout=0.2):
                if isinstance(ev, me.Tick):  # the workers send the module's Tick, not __main__'s
                    report["pids"].append(ev.pid)
                    if name == "sigkill" and ev.index == 1:
                        os.kill(ev.pid, signal.SIGKILL)
                if isinstance(ev, Unresponsive):
                    report["events"].append({"type": "Unresponsive", "index": ev.index})
                    group.kill(ev.index)
                if isinstance(ev, (Started, Done, Failed, Exited)):
                    rec = {"type": type(ev).__name__, "index": ev.index}
                    if isinstance(ev, Done):
                        rec["result"] = ev.result
                    if isinstance(ev, Failed):
                        rec["error"], rec["traceback"] = ev.error, ev.traceback
                    if isinstance(ev, Exited):
                        rec["exitcode"], rec["description"] = ev.exitcode, ev.description
                    report["events"].append(rec)
                # stop: as soon as a worker runs; sigkill: once the killed worker is reported
                wanted = me.Tick if name == "stop" else Exited if name == "sigkill" else ()
                if isinstance(ev, wanted) and not stopped:
                    group.stop_all("test stop")
                    stopped = True
            if name in ("stubborn", "flood") and len(report["pids"]) == 2:
                break
        t1 = time.monotonic()
        if name == "stubborn":
            group.shutdown(grace_s=0.5, term_s=0.5)
        if name == "flood":  # the workers are blocked in a send this process no longer reads: shutdown must
            group.shutdown(grace_s=20.0, term_s=1.0)  # drain their pipes, or they end by SIGKILL after 21 s
        report["shutdown_s"] = time.monotonic() - t1
        report["exitcodes"] = [w.process.exitcode if name not in ("stubborn", "flood") else None for w in group.workers]
    report["returned"] = sorted(p.name for p in Path(returned_dir).iterdir())
    shutil.rmtree(returned_dir)
    report["alive"] = [pid for pid in set(report["pids"]) if _alive(pid)]
    return report


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "spawn")))
