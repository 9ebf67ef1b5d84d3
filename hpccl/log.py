"""hpccl's logging, on the Python library convention: records go to the "hpccl" logger and propagate.

The application's logging configuration decides where they go; with none, Python's last-resort handler
prints warnings (not INFO/TRACE) to stderr. No NullHandler is added on purpose: it would count as a
handler and silence that last resort, and hpccl's warnings (e.g. a small /dev/shm) must show by default.
Each record carries hpccl_host, hpccl_pid, hpccl_rank and hpccl_subsys attributes for the app's formatters.
HPCCL_DEBUG=WARN|INFO|TRACE (read once, at first use) also sets the logger's level and adds hpccl's own
stderr handler, which prints '<host>:<pid>:<rank> hpccl LEVEL SUBSYS message' for the subsystems named
in HPCCL_DEBUG_SUBSYS. reconfigure() re-reads both variables.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from typing import FrozenSet, Optional

from . import config
from .text import plain

TRACE = 5
logging.addLevelName(TRACE, "TRACE")
_LEVELS = {"WARN": logging.WARNING, "INFO": logging.INFO, "TRACE": TRACE}
_FORMAT = "%(hpccl_host)s:%(hpccl_pid)d:%(hpccl_rank)s hpccl %(levelname)s %(hpccl_subsys)s %(message)s"
_logger = logging.getLogger("hpccl")
_rank = "?"
_host: Optional[str] = None
_lock = threading.Lock()
_configured = False
_handler: Optional[logging.Handler] = None   # hpccl's own stderr handler, when HPCCL_DEBUG installed it
_saved_level = logging.NOTSET                # the logger's level before HPCCL_DEBUG set it


class _Context(logging.Filter):
    """Adds hpccl_host/pid/rank/subsys to a record (keeping any already there); never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        global _host
        if _host is None:
            _host = socket.gethostname()
        d = record.__dict__
        d.setdefault("hpccl_host", _host)
        d.setdefault("hpccl_pid", os.getpid())
        d.setdefault("hpccl_rank", _rank)
        d.setdefault("hpccl_subsys", "-")
        return True


class _Subsystems(logging.Filter):
    """Passes records whose hpccl_subsys is in HPCCL_DEBUG_SUBSYS (None: ALL)."""

    def __init__(self, wanted: Optional[FrozenSet[str]]) -> None:
        super().__init__()
        self.wanted = wanted

    def filter(self, record: logging.LogRecord) -> bool:
        return self.wanted is None or getattr(record, "hpccl_subsys", "-") in self.wanted


class _StderrHandler(logging.StreamHandler):
    """A StreamHandler on whatever sys.stderr is when it writes, so later redirection is honoured."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr


_context = _Context()
_logger.addFilter(_context)


def _install() -> None:
    """Read HPCCL_DEBUG/HPCCL_DEBUG_SUBSYS; with HPCCL_DEBUG set, add hpccl's handler and set the level."""
    global _configured, _handler, _saved_level
    if not os.environ.get("HPCCL_DEBUG"):
        _configured = True
        return
    level = _LEVELS[config.get("HPCCL_DEBUG")]
    subsys = config.get("HPCCL_DEBUG_SUBSYS")
    wanted = None if subsys == "ALL" else frozenset(s.strip() for s in subsys.split(",") if s.strip())
    handler = _StderrHandler()
    handler.set_name("hpccl")
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler.addFilter(_context)          # records of child loggers ("hpccl.x") lack the attributes
    handler.addFilter(_Subsystems(wanted))
    _saved_level = _logger.level
    _logger.setLevel(level)
    _logger.addHandler(handler)
    _handler = handler
    _configured = True


def _uninstall() -> None:
    """Remove what _install added: hpccl's handler and the level it set."""
    global _configured, _handler
    if _handler is not None:
        _logger.removeHandler(_handler)
        _handler.close()
        _handler = None
        _logger.setLevel(_saved_level)
    _configured = False


def _ensure_configured() -> None:
    if not _configured:
        with _lock:
            if not _configured:
                _install()


def reconfigure() -> None:
    """Re-read HPCCL_DEBUG and HPCCL_DEBUG_SUBSYS now (for tests); replaces, never adds, hpccl's handler."""
    with _lock:
        _uninstall()
        _install()


def set_rank(rank: int) -> None:
    """Tag later records with this (world) rank."""
    global _rank
    _rank = str(rank)


def _emit(level: int, subsys: str, msg: str, args: tuple) -> None:
    _ensure_configured()
    if not _logger.isEnabledFor(level):
        return
    # one plain line: the arguments carry text from MPI, CUDA, NVML and UCX (control characters, a NUL)
    # stacklevel 3: the record names the hpccl line that called warn/info/trace/log, not this module
    _logger.log(level, "%s", plain(msg % args if args else msg), extra={"hpccl_subsys": subsys}, stacklevel=3)


def log(level: int, subsys: str, msg: str, *args: object) -> None:
    """Log ``msg % args`` at ``level`` for subsystem ``subsys`` (INIT, COLL, TUNING, TRANSPORT, ENV, ...)."""
    _emit(level, subsys, msg, args)


def warn(subsys: str, msg: str, *args: object) -> None:
    """Log a warning: shown by default (Python's last resort) unless the application routes it elsewhere."""
    _emit(logging.WARNING, subsys, msg, args)


def info(subsys: str, msg: str, *args: object) -> None:
    """Log at INFO: shown with HPCCL_DEBUG=INFO or TRACE, or when the application enables INFO."""
    _emit(logging.INFO, subsys, msg, args)


def trace(subsys: str, msg: str, *args: object) -> None:
    """Log at TRACE (5): per-call detail, shown with HPCCL_DEBUG=TRACE."""
    _emit(TRACE, subsys, msg, args)


def tracing() -> bool:
    """True when TRACE is on, so hot paths can skip building messages."""
    _ensure_configured()
    return _logger.isEnabledFor(TRACE)
