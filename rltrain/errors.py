"""The one exception type users see: a configuration or input error, printed as one line."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(Exception):
    """Bad user input. The CLI prints ``rltrain: error: <message>`` and exits 2, without a traceback."""


def close_matches(word: str, candidates: Iterable[str], n: int = 3) -> str:
    """A ``; did you mean ...?`` suffix naming the closest candidates, or an empty string."""
    found = difflib.get_close_matches(word, list(candidates), n=n, cutoff=0.6)
    return f"; did you mean {', '.join(repr(f) for f in found)}?" if found else ""
