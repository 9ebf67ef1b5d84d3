"""One logger for hpccl: HPCCL_DEBUG=WARN|INFO|TRACE, rank-prefixed, filtered by HPCCL_DEBUG_SUBSYS."""
from __future__ import annotations

import logging
import os
import socket
import sys

from . import config

TRACE = 5
logging.addLevelName(TRACE, "TRACE")
_LEVELS = {"WARN": logging.WARNING, "INFO": logging.INFO, "TRACE": TRACE}
_logger = logging.getLogger("hpccl")
_rank = "?"
_configured = False


def _configure() -> None:
    global _configured
    if _configured:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    _logger.addHandler(handler)
    _logger.setLevel(_LEVELS[config.get("HPCCL_DEBUG")])
    _logger.propagate = False
    _configured = True


def set_rank(rank: int) -> None:
    """Prefix later messages with this (world) rank."""
    global _rank
    _rank = str(rank)


def _enabled_subsys(subsys: str) -> bool:
    wanted = config.get("HPCCL_DEBUG_SUBSYS")
    return wanted == "ALL" or subsys in wanted.split(",")


def log(level: int, subsys: str, msg: str, *args: object) -> None:
    """Log ``msg % args`` as '<host>:<pid>:<rank> hpccl LEVEL SUBSYS msg' if level and subsystem are on."""
    _configure()
    if _logger.isEnabledFor(level) and _enabled_subsys(subsys):
        text = msg % args if args else msg
        _logger.log(level, "%s:%d:%s hpccl %s %s %s", socket.gethostname(), os.getpid(), _rank,
                    logging.getLevelName(level), subsys, text)


def warn(subsys: str, msg: str, *args: object) -> None:
    log(logging.WARNING, subsys, msg, *args)


def info(subsys: str, msg: str, *args: object) -> None:
    log(logging.INFO, subsys, msg, *args)


def trace(subsys: str, msg: str, *args: object) -> None:
    log(TRACE, subsys, msg, *args)


def tracing() -> bool:
    """True when TRACE is on, so hot paths can skip building messages."""
    _configure()
    return _logger.isEnabledFor(TRACE)
