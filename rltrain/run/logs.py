"""Where a run's log records go, in every process of the run.

The command line sets logging up through Hydra's job logging (``conf/hydra/job_logging/rltrain.yaml``): records
on stdout and in ``<run dir>/train.log``, rltrain's own (``rltrain.*``) on stderr as ``rltrain: warning:
<message>`` (``LogLines``). ``rltrain.train`` sets up the same two for rltrain's records (``api.py``).

A worker process started with ``spawn`` or ``forkserver`` (a parallel agent, a local rank, an actor) begins with
no handler at all, so a warning from inside it (an env's, a learner's) reached Python's last-resort handler: a
bare line on stderr, in no file. ``LogTargets.of_this_process`` records where this process sends its records, as
plain data that pickles with the worker's arguments; the worker ``install``s the same targets before its target
runs. A forked worker inherits the handlers themselves and keeps them.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

# Hydra's default job-logging format (its ``simple`` formatter), the one train.log is written in
FILE_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


class LogLines(logging.Formatter):
    """A record of rltrain's own loggers (``rltrain.*``) on the terminal as rltrain's printed warnings read,
    ``rltrain: warning: <message>``, not in Hydra's ``[time][logger][LEVEL] - `` format (conf/train.yaml
    ``hydra.job_logging``)."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"rltrain: {record.levelname.lower()}: {record.getMessage()}"
        return text + "\n" + self.formatException(record.exc_info) if record.exc_info else text


@dataclass(frozen=True)
class Target:
    """One handler: ``where`` is ``"stdout"``, ``"stderr"`` or a file's path (appended to); ``fmt`` None is
    ``LogLines``, else a ``logging.Formatter`` format with its ``datefmt``."""

    where: str
    fmt: str | None
    datefmt: str | None
    level: int


@dataclass(frozen=True)
class LoggerTargets:
    """One logger's level, whether it hands records on to its parent, and its handlers."""

    level: int
    propagate: bool
    targets: tuple[Target, ...]


@dataclass(frozen=True)
class LogTargets:
    """The root logger's and rltrain's (``rltrain``) setups: plain data a spawned worker rebuilds."""

    root: LoggerTargets
    rltrain: LoggerTargets

    @classmethod
    def of_this_process(cls) -> LogTargets:
        return cls(_targets_of(logging.getLogger()), _targets_of(logging.getLogger("rltrain")))

    def install(self) -> None:
        """Set this process's root and ``rltrain`` loggers up as recorded, unless it has handlers of its own
        already (a forked worker inherited its parent's: those are kept)."""
        root, mine = logging.getLogger(), logging.getLogger("rltrain")
        if root.handlers or mine.handlers:
            return
        for logger, setup in ((root, self.root), (mine, self.rltrain)):
            logger.setLevel(setup.level)
            logger.propagate = setup.propagate
            for target in setup.targets:
                logger.addHandler(_handler(target))


def _targets_of(logger: logging.Logger) -> LoggerTargets:
    targets = []
    for handler in logger.handlers:
        where = _where(handler)
        if where is None:
            continue  # a handler that cannot be rebuilt from data (a queue, a socket, a notebook's widget)
        fmt = handler.formatter
        if isinstance(fmt, LogLines):
            targets.append(Target(where, None, None, handler.level))
        else:
            targets.append(Target(where, getattr(fmt, "_fmt", None) or logging.BASIC_FORMAT,
                                  getattr(fmt, "datefmt", None), handler.level))
    return LoggerTargets(logger.level, logger.propagate, tuple(targets))


def _where(handler: logging.Handler) -> str | None:
    if isinstance(handler, logging.FileHandler):
        return handler.baseFilename
    if type(handler) is logging.StreamHandler:
        stream = handler.stream
        if stream in (sys.stdout, sys.__stdout__):
            return "stdout"
        if stream in (sys.stderr, sys.__stderr__):
            return "stderr"
    return None


def _handler(target: Target) -> logging.Handler:
    handler: logging.Handler
    if target.where in ("stdout", "stderr"):
        handler = logging.StreamHandler(getattr(sys, target.where))
    else:
        # appended to by every process of the run: each record is one write, whole lines never interleave
        handler = logging.FileHandler(target.where, mode="a", delay=True)
    handler.setFormatter(LogLines() if target.fmt is None else logging.Formatter(target.fmt, target.datefmt))
    handler.setLevel(target.level)
    return handler


def run_file_handler(path: str) -> logging.Handler:
    """``train.log``'s handler for a run made without Hydra's job logging (``rltrain.train``), in Hydra's
    format, so the file reads as the command line's."""
    handler = logging.FileHandler(path, mode="a", delay=True)
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    return handler
