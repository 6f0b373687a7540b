"""Logging: every line names its rank; HOROVODISH_LOG_LEVEL picks the level."""
from __future__ import annotations

import logging
import sys

TRACE = 5
logging.addLevelName(TRACE, "TRACE")
_LEVELS = {"trace": TRACE, "debug": logging.DEBUG, "info": logging.INFO,
           "warning": logging.WARNING, "error": logging.ERROR}


def configure(rank: int, level: str) -> logging.Logger:
    logger = logging.getLogger("horovodish")
    logger.setLevel(_LEVELS[level])
    for handler in list(logger.handlers):
        if getattr(handler, "_horovodish", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler._horovodish = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter(f"[horovodish rank {rank}] %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    return logger


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """A warning that would repeat every step is worth saying once."""
    if message not in _warned:
        _warned.add(message)
        logging.getLogger("horovodish").warning("%s", message)
