"""A stand-in for the distributed trainer's ``run_rank`` (``spawn_ranks`` hands it each rank's launch): it joins no
group and reports what the rank's process holds, for tests of the spawn itself."""

from __future__ import annotations

import os
import socket


def listening_on(port: int) -> list[int]:
    """This process's descriptors that are TCP sockets bound to ``port``."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.getsockname()[1] == port:
                found.append(fd)
        except OSError:
            pass
        finally:
            sock.detach()
    return found


def probe_rank(launch, settings, run_dir, **_) -> dict:
    """The rank's summary: its parent's pid (a forked rank's is the spawning process) and the descriptors bound
    to the rendezvous port it holds."""
    return {"rank": launch.rank, "parent": os.getppid(), "holds": listening_on(launch.master_port)}
