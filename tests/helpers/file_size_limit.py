"""``python -m tests.helpers.file_size_limit <rltrain args>``: run ``rltrain`` under ``ulimit -f``.

The kernel refuses writes past ``RLTRAIN_FSIZE_LIMIT`` bytes with EFBIG (SIGXFSZ ignored, as a shell's
``ulimit -f`` job would see it): a real write failure inside ``torch.save``'s zip writer, which reports it as a
``RuntimeError``, not an ``OSError``; the same path a full disk takes when the zip writer hits it first.
"""

from __future__ import annotations

import os
import resource
import runpy
import signal
import sys

if __name__ == "__main__":
    limit = int(os.environ["RLTRAIN_FSIZE_LIMIT"])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    sys.argv = ["rltrain", *sys.argv[1:]]
    runpy.run_module("rltrain", run_name="__main__", alter_sys=True)
