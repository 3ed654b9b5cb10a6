"""PettingZoo's env warnings (``pettingzoo.utils.env_logger``: an illegal move, an action out of bounds), shown once
each and then counted (``ENV_WARNINGS``, installed by every ``AgentEnv``, envs/multiagent.py);
``report_env_warnings`` says how often each came, at the end of a run's collection and of its final evaluation."""

from __future__ import annotations

import logging


class RepeatedWarnings(logging.Filter):
    """On PettingZoo's env logger: each warning let through the first time, then only counted. A policy that
    ignores the action masks (``algo.action_mask=off``) makes illegal moves all run long, and PettingZoo would
    print one line (and keep one entry) per move."""

    LOGGER = "pettingzoo.utils.env_logger"

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def install(self) -> None:
        logger = logging.getLogger(self.LOGGER)
        if self not in logger.filters:
            logger.addFilter(self)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage().split("\n", 1)[0].strip()
        self.counts[text] = self.counts.get(text, 0) + 1
        if self.counts[text] == 1:
            return True
        from pettingzoo.utils.env_logger import EnvLogger

        EnvLogger.flush()  # its list of every warning, kept for PettingZoo's own tests: one entry per move here
        return False


ENV_WARNINGS = RepeatedWarnings()


def report_env_warnings() -> None:
    """One line per PettingZoo warning that came more than once since the last report (the end of a run's
    collection, of its final evaluation), with its count; the counts start again."""
    for text, n in ENV_WARNINGS.counts.items():
        if n > 1:
            logging.getLogger("rltrain.envs").warning("PettingZoo's warning %r came %d times (shown once)", text, n)
    ENV_WARNINGS.counts.clear()
