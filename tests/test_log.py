"""hpccl.log follows the Python library convention: the app routes or silences it; HPCCL_DEBUG adds hpccl's own handler."""
from __future__ import annotations

import logging
import os
import socket

import pytest

from hpccl import config, log

HPCCL = logging.getLogger("hpccl")


class _Keep(logging.Handler):
    """Collects the records it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    """Each test starts from an unconfigured 'hpccl' logger without handlers and HPCCL_DEBUG unset."""
    monkeypatch.delenv("HPCCL_DEBUG", raising=False)
    monkeypatch.delenv("HPCCL_DEBUG_SUBSYS", raising=False)
    monkeypatch.setattr(HPCCL, "handlers", list(HPCCL.handlers))   # a copy: what a test adds does not leak
    monkeypatch.setattr(HPCCL, "propagate", HPCCL.propagate)   # restored after the test
    monkeypatch.setattr(log, "_rank", "?")
    log.reconfigure()
    yield
    monkeypatch.delenv("HPCCL_DEBUG", raising=False)
    log.reconfigure()
    HPCCL.setLevel(logging.NOTSET)


def _bare_root(monkeypatch) -> None:
    """Make the root logger what an app that configured nothing has: no handlers, level WARNING. Called in
    the test body, since pytest adds its capture handlers to root after fixtures are set up."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)


def test_default_records_reach_app_handler_with_attributes_info_not_emitted(monkeypatch):
    _bare_root(monkeypatch)
    keep = _Keep()
    HPCCL.addHandler(keep)
    log.set_rank(3)
    log.warn("ENV", "/dev/shm has %d MiB", 64)
    log.info("INIT", "not shown by default")
    log.trace("COLL", "nor this")
    assert not log.tracing()
    assert len(keep.records) == 1
    r = keep.records[0]
    assert r.levelno == logging.WARNING and r.getMessage() == "/dev/shm has 64 MiB"
    assert (r.hpccl_rank, r.hpccl_subsys, r.hpccl_pid, r.hpccl_host) == ("3", "ENV", os.getpid(),
                                                                        socket.gethostname())
    assert r.pathname == __file__          # the record names the caller's line, not hpccl/log.py
    assert "hpccl" not in r.getMessage()   # the prefix is not baked into the message text


def test_default_warning_reaches_stderr_via_last_resort(monkeypatch, capfd):
    _bare_root(monkeypatch)
    log.warn("ENV", "small /dev/shm")
    log.info("INIT", "quiet by default")
    err = capfd.readouterr().err
    assert "small /dev/shm" in err
    assert "quiet by default" not in err


def test_app_basicconfig_receives_hpccl_records(monkeypatch, capfd):
    _bare_root(monkeypatch)
    h = logging.StreamHandler()            # what logging.basicConfig installs, with the app's format
    h.setFormatter(logging.Formatter("APP %(name)s %(levelname)s r%(hpccl_rank)s %(hpccl_subsys)s %(message)s"))
    logging.getLogger().addHandler(h)
    log.set_rank(1)
    log.warn("TUNING", "algo %s unavailable", "tree")
    assert capfd.readouterr().err == "APP hpccl WARNING r1 TUNING algo tree unavailable\n"


def test_app_silences_with_level(monkeypatch, capfd):
    _bare_root(monkeypatch)
    keep = _Keep()
    logging.getLogger().addHandler(keep)
    HPCCL.setLevel(logging.ERROR)
    log.warn("ENV", "silenced")
    assert capfd.readouterr().err == ""
    assert keep.records == []


def test_app_silences_by_stopping_propagation(monkeypatch, capfd):
    _bare_root(monkeypatch)
    keep = _Keep()
    logging.getLogger().addHandler(keep)
    HPCCL.propagate = False
    HPCCL.addHandler(logging.NullHandler())   # without one, Python's last resort would still print warnings
    log.warn("ENV", "silenced")
    assert keep.records == []
    assert capfd.readouterr().err == ""


def test_hpccl_debug_installs_one_prefixed_handler(monkeypatch, capfd):
    _bare_root(monkeypatch)
    monkeypatch.setenv("HPCCL_DEBUG", "INFO")
    log.reconfigure()
    log.reconfigure()
    assert len(HPCCL.handlers) == 1
    assert HPCCL.level == logging.INFO
    log.set_rank(2)
    log.info("INIT", "communicator rank %d/%d", 2, 4)
    log.trace("COLL", "not at INFO")
    err = capfd.readouterr().err
    assert err == f"{socket.gethostname()}:{os.getpid()}:2 hpccl INFO INIT communicator rank 2/4\n"


def test_hpccl_debug_subsys_filters_own_handler(monkeypatch, capfd):
    _bare_root(monkeypatch)
    monkeypatch.setenv("HPCCL_DEBUG", "TRACE")
    monkeypatch.setenv("HPCCL_DEBUG_SUBSYS", "init,tuning")
    log.reconfigure()
    assert log.tracing()
    log.info("INIT", "kept init")
    log.trace("TUNING", "kept tuning")
    log.warn("ENV", "dropped env")
    log.trace("COLL", "dropped coll")
    lines = capfd.readouterr().err.splitlines()
    assert [ln.split(" hpccl ")[1] for ln in lines] == ["INFO INIT kept init", "TRACE TUNING kept tuning"]


def test_reconfigure_removes_handler_and_level(monkeypatch, capfd):
    _bare_root(monkeypatch)
    monkeypatch.setenv("HPCCL_DEBUG", "INFO")
    log.reconfigure()
    monkeypatch.delenv("HPCCL_DEBUG")
    log.reconfigure()
    assert HPCCL.handlers == [] and HPCCL.level == logging.NOTSET
    log.info("INIT", "gone")
    assert capfd.readouterr().err == ""


def test_environment_read_once_not_per_message(monkeypatch, capfd):
    _bare_root(monkeypatch)
    monkeypatch.setenv("HPCCL_DEBUG", "INFO")
    log.reconfigure()
    calls = []
    real = config.get
    monkeypatch.setattr(config, "get", lambda name: calls.append(name) or real(name))
    monkeypatch.setenv("HPCCL_DEBUG_SUBSYS", "COLL")   # no effect until reconfigure()
    for i in range(5):
        log.info("INIT", "message %d", i)
    log.tracing()
    assert calls == []
    assert capfd.readouterr().err.count(" hpccl INFO INIT message ") == 5
    log.reconfigure()
    assert "HPCCL_DEBUG_SUBSYS" in calls
    log.info("INIT", "now filtered")
    assert capfd.readouterr().err == ""


def test_invalid_hpccl_debug_still_raises(monkeypatch):
    _bare_root(monkeypatch)
    monkeypatch.setenv("HPCCL_DEBUG", "loud")
    with pytest.raises(Exception, match="HPCCL_DEBUG"):
        log.reconfigure()
