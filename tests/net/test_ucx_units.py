"""Single-process checks of the UCX transport's configuration logic (no MPI launch, no namespaces)."""
from __future__ import annotations

import os

import pytest

ucx = pytest.importorskip("hpccl.transport.ucx", reason="ucxx is not installed (pip install ucxx-cu13 "
                                                         "libucx-cu13==1.20.1)")

INFO = """#      resource 0  :  md 0  dev 0  flags -- self/memory
#      resource 1  :  md 1  dev 1  flags -- tcp/net0
#      resource 2  :  md 2  dev 2  flags -- posix/memory
#      resource 3  :  md 3  dev 3  flags -- cuda_copy/cuda
#      resource 4  :  md 4  dev 4  flags -- rc_mlx5/mlx5_0:1"""


@pytest.mark.parametrize("tls,on", [("", False), ("all", False), ("tcp,self", True), ("tcp", True),
                                    ("rc,ud,self", True), ("dc_x,self", True), ("sm,self", False),
                                    ("tcp,cuda_copy,self", False), ("^sm", False), ("posix,tcp", False)])
def test_error_handling_only_for_network_transports(tls, on):
    assert ucx._error_handling(tls) is on


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


def test_importing_ucxx_leaves_the_environment_alone():
    """ucxx's __init__ sets these three; hpccl's import takes them back out (the test run sets none)."""
    leaked = [n for n in ("UCX_MEMTYPE_CACHE", "UCX_RNDV_THRESH", "UCX_RNDV_FRAG_MEM_TYPE") if n in os.environ]
    assert not leaked, leaked


def test_wire_settings_yield_to_the_user_and_to_the_switch(monkeypatch):
    for k in ucx.WIRE_TCP:
        monkeypatch.delenv(f"UCX_{k}", raising=False)
    monkeypatch.delenv("HPCCL_UCX_TCP_TUNE", raising=False)
    assert ucx.wire_config() == ucx.WIRE_TCP
    monkeypatch.setenv("UCX_TCP_SNDBUF", "1m")  # the user's setting wins: hpccl leaves that one to UCX
    assert "TCP_SNDBUF" not in ucx.wire_config() and "TCP_RCVBUF" in ucx.wire_config()
    monkeypatch.setenv("HPCCL_UCX_TCP_TUNE", "0")
    assert ucx.wire_config() == {}


def test_ucx_accepts_the_wire_settings(monkeypatch):
    """The settings are real UCX options of the UCX hpccl loads: a context takes them and reports them."""
    for k in ucx.WIRE_TCP:
        monkeypatch.delenv(f"UCX_{k}", raising=False)
    ctx = ucx._api.UCXContext({"TLS": "tcp,self", **ucx.wire_config()}, feature_flags=(ucx._api.Feature.TAG,))
    cfg = ctx.config  # UCX reports the transport's options without their TCP_ prefix
    for k, v in ucx.WIRE_TCP.items():
        assert cfg[k.removeprefix("TCP_")].lower() == v, (k, cfg.get(k.removeprefix("TCP_")))
