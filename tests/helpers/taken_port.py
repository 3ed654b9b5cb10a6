"""``python -m tests.helpers.taken_port <rltrain arguments>``: rltrain with an adversary in its process that tries
to take the local spawn's rendezvous port the moment the ranks are started, before rank 0 could bind it: it binds
``master_addr:master_port`` of the first rank's job and listens there (accepting nothing), as another program
would that happened to pick the same free port.

It says on stderr which it got: ``taken_port: took <host>:<port>`` (the port was free to take: a spawn that
picked it, released it and leaves the binding to rank 0 loses it) or ``taken_port: held <host>:<port>`` (the
parent still held it). The wrapped method is ``WorkerGroup.start``, which every multi-process trainer uses.
"""

from __future__ import annotations

import socket
import sys

SQUATTERS: list[socket.socket] = []  # kept open until the process ends, as the other program would keep it


def take(host: str, port: int) -> None:
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        squatter.bind((host, port))
        squatter.listen(16)
    except OSError:
        squatter.close()
        print(f"taken_port: held {host}:{port}", file=sys.stderr, flush=True)
        return
    SQUATTERS.append(squatter)
    print(f"taken_port: took {host}:{port}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    from rltrain.trainers.ranks import RankJob
    from rltrain.trainers.supervise import WorkerGroup

    start = WorkerGroup.start

    def start_after_taking(self, target, payload):
        if isinstance(payload, RankJob) and payload.launch.rank == 0:
            take(payload.launch.master_addr, payload.launch.master_port)
        return start(self, target, payload)

    WorkerGroup.start = start_after_taking
    from rltrain.cli.train import main

    sys.argv = ["rltrain", *sys.argv[1:]]
    main()
