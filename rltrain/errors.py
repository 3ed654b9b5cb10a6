"""The one exception type users see: a configuration or input error, printed as one line."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(Exception):
    """Bad user input. The CLI prints ``rltrain: error: <message>`` and exits 2, without a traceback."""


class UserCodeError(ConfigError):
    """The user's own code (an env, its factory) raised: one line like any ``ConfigError``, raised ``from`` the
    original exception so that its traceback can go to ``error.txt`` (and to the terminal with
    ``HYDRA_FULL_ERROR=1``)."""


class RunDirRefused(ConfigError):
    """The run dir is not this command's to write: another run holds it (its lock), it holds an earlier run
    this command would overwrite or contradict, or it cannot be written. Nothing is written there; a sweep lists
    the job ``refused``, apart from the jobs that ran and failed (whose own dirs say so)."""


class UnknownEnv(ConfigError):
    """``env.id`` names no env Gymnasium knows in this process. A tool that runs in a process of its own
    (``rltrain-eval``) adds that an id registered in a notebook or a script is known there only."""


def described(err: BaseException) -> str:
    """``Type: message``; an exception without a message (a bare ``assert``) named by where it was raised."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if text:
        return f"{type(err).__name__}: {text}"
    import traceback

    frames = traceback.extract_tb(err.__traceback__) if err.__traceback__ is not None else []
    if frames:
        return f"{type(err).__name__} at {frames[-1].filename}:{frames[-1].lineno} ({frames[-1].line or ''})"
    return type(err).__name__


def close_matches(word: str, candidates: Iterable[str], n: int = 3) -> str:
    """A ``; did you mean ...?`` suffix naming the closest candidates, or an empty string."""
    found = difflib.get_close_matches(word, list(candidates), n=n, cutoff=0.6)
    return f"; did you mean {', '.join(repr(f) for f in found)}?" if found else ""


def spelled(value: object) -> str:
    """A setting's value as the command line spells it (``true``, ``null``, ``[64,64]``), for the lines that
    name one."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(spelled(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{spelled(v)}" for k, v in value.items()) + "}"
    return str(value)


def only_with(condition: str, now: object) -> str:
    """Why a setting is not read (a settings class's ``unread_keys``): the value of another one that would make
    it read, and what that one is now, e.g. ``only algo.distributional=qr uses it (now none)``."""
    return f"only {condition} uses it (now {spelled(now)})"
