"""The ``no_leaks`` fixture's /dev/shm rule (tests/conftest.py ``ShmWatch``): an entry this test's own
processes held and left behind with no live holder is a leak; an entry they never held (another test run's,
beside this one under pytest-xdist) is not, nor is one a live process still holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ShmWatch

# maps a /dev/shm entry and closes its descriptor (only /proc/<pid>/maps shows it held), then waits for stdin;
# with "unlink" it removes the entry before exiting, without it the entry is left behind
HOLD = ("import mmap, os, sys\nfd = os.open('/dev/shm/' + sys.argv[1], os.O_CREAT | os.O_RDWR)\n"
        "os.ftruncate(fd, 4096)\nm = mmap.mmap(fd, 4096)\nos.close(fd)\nprint('up', flush=True)\n"
        "sys.stdin.read()\nm.close()\nif sys.argv[2:] == ['unlink']:\n    os.unlink('/dev/shm/' + sys.argv[1])\n")


def _hold(name: str, *, unlink: bool) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, name, *(["unlink"] if unlink else [])],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def test_an_entry_left_by_this_tests_process_is_a_leak_and_others_are_not():
    pid = os.getpid()
    held, left, foreign = f"wnsm_held_{pid}", f"wnsm_left_{pid}", Path(f"/dev/shm/wnsm_foreign_{pid}")
    watch = ShmWatch()
    try:
        holder, leaver = _hold(held, unlink=True), _hold(left, unlink=False)
        foreign.write_bytes(b"\0" * 64)  # made by no process of this test: another run's entry
        watch.sample()
        assert {held, left} <= watch.ours and foreign.name not in watch.ours
        assert not watch.leaked()  # both still held by live processes
        leaver.communicate("", timeout=30)  # exits and leaves its entry behind
        assert watch.leaked() == {left}
        holder.communicate("", timeout=30)  # exits and removes its entry
        watch.stop()
        assert watch.leaked() == {left}
    finally:
        for name in (left, foreign.name):
            Path(f"/dev/shm/{name}").unlink(missing_ok=True)
    assert not watch.leaked()
