"""``python -m tests.helpers.full_disk <rltrain args>``: run ``rltrain`` on a disk that fills up.

``os.fsync`` of a file whose name matches ``RLTRAIN_FULL_DISK`` (an fnmatch pattern; several separated by
``|``) fails with ENOSPC once ``RLTRAIN_FULL_DISK_AFTER`` matching fsyncs have succeeded. That is where a real
full disk reports with delayed allocation, and it leaves a partly written temp file behind, as the real thing
does. Reliable in CI: no tmpfs to mount, no root needed.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import runpy
import sys


def install(patterns: list[str], after: int) -> None:
    real_fsync = os.fsync
    matched = 0

    def fsync(fd) -> None:
        nonlocal matched
        fileno = fd if isinstance(fd, int) else fd.fileno()
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fileno}"))
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):
            matched += 1
            if matched > after:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    os.fsync = fsync


if __name__ == "__main__":
    install(os.environ["RLTRAIN_FULL_DISK"].split("|"), int(os.environ.get("RLTRAIN_FULL_DISK_AFTER", "0")))
    sys.argv = ["rltrain", *sys.argv[1:]]
    runpy.run_module("rltrain", run_name="__main__", alter_sys=True)
