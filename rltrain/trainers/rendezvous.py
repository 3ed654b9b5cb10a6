"""Where the ranks of ``distributed_simulator`` come from: our own local spawn, torchrun, or SLURM.

``detect_launch`` reads the environment once. torchrun exports RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT; a SLURM step (srun, or submitit's ``tasks_per_node``) exports SLURM_PROCID /
SLURM_NTASKS / SLURM_LOCALID / SLURM_NODELIST, from which the rendezvous address is derived (first host of
the node list, a port from the job id) so every task finds the same one without talking first.

``join_group`` joins the process group within a bounded time and honours a stop while it waits: torch's own
rendezvous blocks inside C++ (no signal handler runs), and a client whose address answers but is no
``torch.distributed`` store (another service on ``MASTER_PORT``) waits there forever. It runs in a thread the
rank watches: a stop request raises at once, a taken port or a peer that is not a store is one line.

A local spawn's store is ``LocalRendezvous``: the spawning parent serves it on a port it has held since the OS
picked it, so no other process can take that port before the ranks join (torchrun and SLURM ranks rendezvous
on the MASTER_ADDR / MASTER_PORT their launcher set, as torch's ``env://`` does).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from rltrain.errors import ConfigError
from rltrain.run.signals import StopFlag

SLURM_PORT_BASE, SLURM_PORT_SPAN = 15000, 20000  # job ids map into [15000, 35000): below the ephemeral range


@dataclass(frozen=True)
class LaunchInfo:
    """One rank's place in the job. ``source`` is ``local`` (we spawned it; the spawning parent serves the store,
    ``LocalRendezvous``), ``torchrun`` or ``slurm`` (rank 0, or torchrun's agent, serves it on MASTER_PORT)."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def export(self) -> None:
        """Set the torch.distributed variables in this process (user env code may read RANK, too)."""
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.local_rank),
                          MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.master_port))


def _int_env(env: dict, key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise ConfigError(f"environment variable {key}={env[key]!r} is not an integer") from None


def detect_launch(env: dict | None = None) -> LaunchInfo | None:
    """The rank this process already is (torchrun or a multi-task SLURM step), or None: spawn our own.

    A SLURM allocation with a single task is not a distributed launch: ``trainer.world_size`` ranks are
    then spawned locally inside it.
    """
    env = dict(os.environ if env is None else env)
    if "RANK" in env and "WORLD_SIZE" in env:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in env]
        if missing:
            raise ConfigError(f"RANK/WORLD_SIZE are set but {', '.join(missing)} not: launch with torchrun, "
                              "or unset RANK to let trainer=distributed_simulator spawn its own ranks")
        return LaunchInfo(rank=_int_env(env, "RANK"), world_size=_int_env(env, "WORLD_SIZE"),
                          local_rank=_int_env(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
                          master_addr=env["MASTER_ADDR"], master_port=_int_env(env, "MASTER_PORT"),
                          source="torchrun")
    ntasks_key = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    if "SLURM_PROCID" in env and ntasks_key in env and _int_env(env, ntasks_key) > 1:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise ConfigError("SLURM_PROCID is set but no SLURM_NODELIST: cannot find the rendezvous host")
        job_id = _int_env(env, "SLURM_JOB_ID") if "SLURM_JOB_ID" in env else 0
        port = _int_env(env, "MASTER_PORT") if "MASTER_PORT" in env else SLURM_PORT_BASE + job_id % SLURM_PORT_SPAN
        return LaunchInfo(rank=_int_env(env, "SLURM_PROCID"), world_size=_int_env(env, ntasks_key),
                          local_rank=_int_env(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
                          master_addr=env.get("MASTER_ADDR") or first_host(nodelist), master_port=port,
                          source="slurm")
    return None


def first_host(nodelist: str) -> str:
    """First host of a SLURM node list: ``scontrol show hostnames`` when available, else our parser."""
    if shutil.which("scontrol"):
        try:
            out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                 timeout=10, check=True).stdout.split()
            if out:
                return out[0]
        except (subprocess.SubprocessError, OSError):
            pass
    return expand_nodelist(nodelist)[0]


def expand_nodelist(nodelist: str) -> list[str]:
    """``gpu[01-03,07],login1`` -> ``[gpu01, gpu02, gpu03, gpu07, login1]`` (SLURM's compressed host lists;
    several bracket groups in one name, e.g. ``r[1-2]n[3-4]``, expand as a product)."""
    hosts: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", nodelist):
        hosts.extend(_expand_one(item.strip()))
    if not hosts:
        raise ConfigError(f"cannot parse the SLURM node list {nodelist!r}")
    return hosts


def _expand_one(item: str) -> list[str]:
    m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", item)
    if not m:
        return [item] if item else []
    prefix, ranges, rest = m.groups()
    out = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        width = len(lo)
        for i in range(int(lo), int(hi or lo) + 1):
            out.extend(f"{prefix}{i:0{width}d}{tail}" for tail in _expand_one(rest) or [""])
    return out


def _bound_socket(host: str) -> socket.socket:
    """A TCP socket bound to a port the OS picks on ``host``; an address that is not this machine's (or no address
    at all, e.g. ``256.1.1.1``) is a one-line error, not a socket traceback."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, 0))
    except OSError as err:  # socket.gaierror (no such name / address) is an OSError too
        s.close()
        reason = err.strerror or str(err)
        raise ConfigError(f"trainer.master_addr={host}: cannot listen on it for the rendezvous ({reason}); "
                          "use 127.0.0.1 or an address of this machine") from None
    return s


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host``, released on return: for a port handed to another program (torchrun's
    ``--master_port``), which may lose it to anyone in between. The local spawn holds its own (``LocalRendezvous``)."""
    with _bound_socket(host) as s:
        return int(s.getsockname()[1])


class LocalRendezvous:
    """The rendezvous store of a local spawn, served by the spawning parent on a port it holds from the OS's pick
    to the end of the run. A port picked, released and bound again later by rank 0 could be taken in between by
    any other process (another run on the node, a parallel test); this one never is free until ``close``.

    ``serve`` must come after the ranks are started: the store's server is a C++ thread, and a rank forked after
    it would inherit a copy of its locks without the thread (a forked rank inherits only the bare listening
    socket, which it closes, and the parent closes the store after every rank has ended). Ranks join it as
    clients (``join_group``); the parent outlives them, so the store also outlives a rank that dies, and its
    heartbeat counters still tell which one did. A forked rank closes its inherited copy of the socket at start
    (``ranks.release_inherited``, given ``fileno``), so no rank keeps the port bound past the parent.
    """

    def __init__(self, host: str, world_size: int, timeout_s: float):
        self.host, self.world_size, self.timeout_s = host, world_size, timeout_s
        self._sock: socket.socket | None = _bound_socket(host)
        self._sock.listen()  # now: a rank that connects before ``serve`` waits in the backlog, not refused
        self.port = int(self._sock.getsockname()[1])
        self._store = None

    def serve(self) -> None:
        """Answer as a ``torch.distributed`` store on the socket held since ``__init__`` (the store owns it then)."""
        import torch.distributed as dist

        if self._sock is None:  # served already, or closed: the port may be anyone's by now
            raise RuntimeError("LocalRendezvous.serve: the socket is no longer held (served or closed)")
        self._store = dist.TCPStore(self.host, self.port, self.world_size, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=self.timeout_s), master_listen_fd=self._sock.fileno())
        self._sock.detach()  # the store closes the descriptor when it ends; Python must not close it as well
        self._sock = None

    def fileno(self) -> int | None:
        """The listening socket's descriptor while held (the number a forked rank inherits it at), else None."""
        return self._sock.fileno() if self._sock is not None else None

    def close(self) -> None:
        """Release the port: the socket if never served, else the store (its server stops when its last reference
        goes). Safe to call twice."""
        if self._sock is not None:
            with contextlib.suppress(OSError):  # a store that failed to start may have closed it already
                self._sock.close()
            self._sock = None
        self._store = None

    def __enter__(self) -> LocalRendezvous:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# a port that accepts connections but whose store has not answered the handshake this long is not a store
NOT_A_STORE_S = 10.0


def join_group(launch: LaunchInfo, *, backend: str, timeout_s: float, stop: StopFlag | None):
    """``torch.distributed.init_process_group`` for ``launch`` (its env:// variables exported first), waited for in
    this thread with ``stop`` checked, refused in one line when the rendezvous port is another process's or the
    peer there does not answer as a store (``NOT_A_STORE_S``), or nobody came within ``timeout_s``. Returns the
    rendezvous store (the ranks' heartbeats use it)."""
    import torch.distributed as dist

    launch.export()  # env:// also reuses torchrun's own store (TORCHELASTIC_USE_AGENT_STORE)
    where = f"{launch.master_addr}:{launch.master_port}"
    outcome: dict = {}
    local = launch.source == "local"  # the spawning parent serves the store (``LocalRendezvous``): every rank a client

    def join() -> None:
        try:
            timeout = timedelta(seconds=timeout_s)
            if local:
                store = dist.TCPStore(launch.master_addr, launch.master_port, launch.world_size, is_master=False,
                                      timeout=timeout)
                rank, world_size = launch.rank, launch.world_size
            else:
                store, rank, world_size = next(dist.rendezvous("env://", launch.rank, launch.world_size,
                                                               timeout=timeout))
            outcome["store"] = store  # the handshake with the store is done: what follows waits for the peers
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
            outcome["ok"] = True
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = err

    thread = threading.Thread(target=join, name="rltrain-rendezvous", daemon=True)
    thread.start()
    started, answering = time.monotonic(), None
    # no other service can answer where the parent holds the port, nor where this rank serves the store itself
    squatter_free = local or (launch.is_main and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True")
    while thread.is_alive():
        thread.join(0.2)
        if stop is not None:
            stop.check("the rendezvous")
        now = time.monotonic()
        if not squatter_free and answering is None and "store" not in outcome and \
                _accepts(launch.master_addr, launch.master_port):
            answering = now
        if answering is not None and "store" not in outcome and thread.is_alive() and now - answering > NOT_A_STORE_S:
            raise ConfigError(f"rendezvous: {where} (MASTER_ADDR:MASTER_PORT) accepts connections but has not "
                              f"answered as a torch.distributed store for {NOT_A_STORE_S:g} s: another service "
                              "listens there; pick a free MASTER_PORT")
        if thread.is_alive() and now - started > timeout_s:
            raise ConfigError(f"rendezvous: rank {launch.rank} found no peers at {where} within trainer.timeout_s="
                              f"{timeout_s:g} (is every rank started, with the same MASTER_ADDR / MASTER_PORT?)")
    err = outcome.get("error")
    if err is None:
        return outcome["store"]
    text = str(err)
    if "EADDRINUSE" in text or "address already in use" in text.lower():
        # only where the user named the port (torchrun, SLURM): a local spawn's is held from its pick on
        raise ConfigError(f"rendezvous: the port {where} (MASTER_ADDR:MASTER_PORT) is taken by another process; "
                          "set MASTER_PORT to a free port") from None
    raise err


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False
