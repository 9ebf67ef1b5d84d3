"""Single-process checks of the native engine's UCX settings (hpccl/transport/ucx_config.py): UCX_TLS,
UCX_NET_DEVICES and the TCP wire settings (no MPI launch, no namespaces)."""
from __future__ import annotations

import pytest

from hpccl.errors import HpcclInvalidArgument
from hpccl.transport import ucx_config as ucx

INFO = """#      resource 0  :  md 0  dev 0  flags -- self/memory
#      resource 1  :  md 1  dev 1  flags -- tcp/net0
#      resource 2  :  md 2  dev 2  flags -- posix/memory
#      resource 3  :  md 3  dev 3  flags -- cuda_copy/cuda
#      resource 4  :  md 4  dev 4  flags -- rc_mlx5/mlx5_0:1"""


def test_hpccl_ucx_tls_fills_in_an_unset_or_empty_ucx_tls(monkeypatch):
    monkeypatch.setenv("HPCCL_UCX_TLS", "tcp,self")
    monkeypatch.delenv("UCX_TLS", raising=False)
    assert ucx._tls() == "tcp,self"
    monkeypatch.setenv("UCX_TLS", "")
    assert ucx._tls() == "tcp,self"
    monkeypatch.setenv("UCX_TLS", "sm,self")
    assert ucx._tls() == "sm,self"  # UCX_TLS wins


def test_net_devices_check(monkeypatch):
    monkeypatch.delenv("UCX_NET_DEVICES", raising=False)
    assert ucx._device_problem(INFO) is None
    monkeypatch.setenv("UCX_NET_DEVICES", "net0,mlx5_0:1")
    assert ucx._device_problem(INFO) is None
    monkeypatch.setenv("UCX_NET_DEVICES", "net0,typo0")  # one usable: a warning, not an error
    assert ucx._device_problem(INFO) is None
    no_net = "\n".join(line for line in INFO.splitlines() if "tcp/" not in line and "rc_mlx5" not in line)
    monkeypatch.setenv("UCX_NET_DEVICES", "nonexistent")
    msg = ucx._device_problem(no_net)
    assert msg and "UCX_NET_DEVICES=nonexistent" in msg and "this host has" in msg


def test_wire_settings_yield_to_the_user_and_to_the_switch(monkeypatch):
    for k in ucx.WIRE_TCP_NAMES:
        monkeypatch.delenv(f"UCX_{k}", raising=False)
    monkeypatch.delenv("HPCCL_UCX_TCP_TUNE", raising=False)
    monkeypatch.delenv("HPCCL_UCX_TCP_SEG", raising=False)
    assert ucx.wire_config() == ucx.wire_tcp() == {"TCP_TX_SEG_SIZE": "524288", "TCP_RX_SEG_SIZE": "524288",
                                                   "TCP_SNDBUF": "8m", "TCP_RCVBUF": "8m"}
    monkeypatch.setenv("UCX_TCP_SNDBUF", "1m")  # the user's setting wins: hpccl leaves that one to UCX
    assert "TCP_SNDBUF" not in ucx.wire_config() and "TCP_RCVBUF" in ucx.wire_config()
    monkeypatch.setenv("HPCCL_UCX_TCP_TUNE", "0")
    assert ucx.wire_config() == {}


def test_segment_size_is_a_setting_checked_before_use(monkeypatch):
    """HPCCL_UCX_TCP_SEG sets both segment sizes; a value UCX cannot take is refused naming the variable."""
    for k in ucx.WIRE_TCP_NAMES:
        monkeypatch.delenv(f"UCX_{k}", raising=False)
    monkeypatch.delenv("HPCCL_UCX_TCP_TUNE", raising=False)
    monkeypatch.setenv("HPCCL_UCX_TCP_SEG", "128k")
    wire = ucx.wire_config()
    assert wire["TCP_TX_SEG_SIZE"] == wire["TCP_RX_SEG_SIZE"] == str(128 << 10)
    for bad in ("4k", "32m", "lots"):
        monkeypatch.setenv("HPCCL_UCX_TCP_SEG", bad)
        with pytest.raises(HpcclInvalidArgument, match="HPCCL_UCX_TCP_SEG"):
            ucx.wire_config()


def _engine_with_default_wire(monkeypatch):
    """The native engine module (the test skips, saying so, where it is not built), with hpccl's default TCP
    settings: no UCX_TCP_* or HPCCL_UCX_TCP_* in the environment."""
    try:
        from hpccl.transport.engine import load
        ne = load()
    except ImportError as exc:  # pragma: no cover - the engine is built by the normal install
        pytest.skip(f"the network engine is not built here: {exc}")
    for k in ucx.WIRE_TCP_NAMES:
        monkeypatch.delenv(f"UCX_{k}", raising=False)
    monkeypatch.delenv("HPCCL_UCX_TCP_TUNE", raising=False)
    monkeypatch.delenv("HPCCL_UCX_TCP_SEG", raising=False)
    return ne


def test_the_engine_accepts_the_wire_settings(monkeypatch):
    """The settings are real UCX options of the UCX the engine loads: an engine is made with them, while a
    name UCX does not know is refused (ValueError), so the acceptance is not vacuous."""
    ne = _engine_with_default_wire(monkeypatch)
    assert ucx.wire_config() == ucx.wire_tcp()
    eng = ne.Engine(0, 1, {"TLS": "tcp,self", **ucx.wire_config()})
    eng.close()
    with pytest.raises(ValueError, match="TCP_NO_SUCH_OPTION"):
        ne.Engine(0, 1, {"TLS": "tcp,self", "TCP_NO_SUCH_OPTION": "1"})


def test_more_ucx_settings_for_hpccls_context_alone_parse_or_name_the_variable(monkeypatch):
    """HPCCL_UCX_CONFIG: 'NAME=value;NAME=value', the UCX_ prefix optional, names upper-cased; anything
    else is refused naming the variable."""
    from hpccl import config
    monkeypatch.delenv("HPCCL_UCX_CONFIG", raising=False)
    assert config.get("HPCCL_UCX_CONFIG") == {}
    monkeypatch.setenv("HPCCL_UCX_CONFIG", " proto_info=y; UCX_TCP_TX_SEG_SIZE = 64k ;")
    assert config.get("HPCCL_UCX_CONFIG") == {"PROTO_INFO": "y", "TCP_TX_SEG_SIZE": "64k"}
    monkeypatch.setenv("HPCCL_UCX_CONFIG", "TLS=tcp,self;NET_DEVICES=eth0,eth1")  # values keep their commas
    assert config.get("HPCCL_UCX_CONFIG") == {"TLS": "tcp,self", "NET_DEVICES": "eth0,eth1"}
    for bad in ("PROTO_INFO", "=y", "TLS=", "A=1;B"):
        monkeypatch.setenv("HPCCL_UCX_CONFIG", bad)
        with pytest.raises(HpcclInvalidArgument, match="HPCCL_UCX_CONFIG"):
            config.get("HPCCL_UCX_CONFIG")


class _OneRank:
    """The bootstrap of a communicator of one rank (allgather is the rank's own value)."""

    size = 1

    def allgather(self, value):
        return [value]


def test_more_ucx_settings_reach_the_engine_over_hpccls_own_and_a_refused_one_is_named(monkeypatch):
    """The engine's context gets HPCCL_UCX_CONFIG after hpccl's TCP settings (it wins over them); a name
    UCX does not know fails the set-up naming HPCCL_UCX_CONFIG and the setting, instead of the silent
    fall-back to UCX's defaults that a refused TCP setting of hpccl's own gets."""
    _engine_with_default_wire(monkeypatch)
    from hpccl.errors import HpcclEnvironmentError
    from hpccl.transport.engine import EngineTransport
    monkeypatch.setenv("HPCCL_UCX_TLS", "tcp,self")
    monkeypatch.setenv("HPCCL_UCX_CONFIG", "TCP_TX_SEG_SIZE=64k")
    t = EngineTransport(_OneRank(), 0, [0])
    try:
        assert t._cfg["TCP_TX_SEG_SIZE"] == "64k" and t._cfg["TCP_RX_SEG_SIZE"] == str(512 << 10)
    finally:
        t.close()
    monkeypatch.setenv("HPCCL_UCX_CONFIG", "TCP_NO_SUCH_OPTION=1")
    with pytest.raises(HpcclEnvironmentError, match="HPCCL_UCX_CONFIG.*TCP_NO_SUCH_OPTION"):
        EngineTransport(_OneRank(), 0, [0])
