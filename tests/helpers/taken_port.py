"""``python -m tests.helpers.taken_port <rltrain arguments>``: rltrain whose local spawn of ranks is handed a
rendezvous port another process listens on (it accepts connections and never answers), as when another
program takes the free port between the moment it is picked and rank 0's bind."""

from __future__ import annotations

import socket
import sys

if __name__ == "__main__":
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen(16)
    port = squatter.getsockname()[1]

    import rltrain.trainers.ranks as ranks

    ranks.free_port = lambda host="127.0.0.1": port
    from rltrain.cli.train import main

    sys.argv = ["rltrain", *sys.argv[1:]]
    main()
