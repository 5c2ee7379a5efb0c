"""Connection handling without a cluster (orchestrator.sweep.connect): the timeout setting, the
address forms, when the driver turns token authentication on, and a dead address failing fast.
The same paths against a real cluster are in test_cluster.py."""
from __future__ import annotations

import os
import socket
import time

import pytest

from lime_arch import ConfigError
from orchestrator.sweep import connect
from orchestrator.sweep.tune_report import objective_key


def test_connect_timeout_flag_env_default(monkeypatch):
    monkeypatch.delenv(connect.TIMEOUT_ENV, raising=False)
    assert connect.connect_timeout() == 30.0
    monkeypatch.setenv(connect.TIMEOUT_ENV, "7.5")
    assert connect.connect_timeout() == 7.5
    assert connect.connect_timeout(3) == 3.0  # the flag wins
    for bad in ("0", "-1", "soon"):
        monkeypatch.setenv(connect.TIMEOUT_ENV, bad)
        with pytest.raises(ConfigError, match=f"{connect.TIMEOUT_ENV}: must be a number of seconds > 0"):
            connect.connect_timeout()
    with pytest.raises(ConfigError, match="--connect-timeout: must be"):
        connect.connect_timeout(0)


def test_addresses():
    assert connect.split_address("10.1.2.3:6379") == ("10.1.2.3", 6379)
    assert connect.split_address("[::1]:6379") == ("::1", 6379)
    assert connect.split_address("auto") is None
    with pytest.raises(ConfigError, match="Ray Client"):
        connect.split_address("ray://head:10001")
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        connect.split_address("head")


def test_token_mode_is_turned_on_only_when_unset_and_a_token_exists(tmp_path, monkeypatch):
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert connect.use_token_if_available() is None and "RAY_AUTH_MODE" not in os.environ
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("a" * 64)
    assert connect.use_token_if_available() == str(tmp_path / ".ray" / "auth_token")
    assert os.environ["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # an explicit choice is kept
    connect.use_token_if_available()
    assert os.environ["RAY_AUTH_MODE"] == "disabled"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "x")
    assert connect.token_source() == "$RAY_AUTH_TOKEN"


def test_a_dead_address_fails_within_the_timeout():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    t0 = time.monotonic()
    with pytest.raises(connect.ConnectError, match=f"127.0.0.1:{port}: no Ray cluster reachable"):
        connect.probe("127.0.0.1", port, 2.0)
    assert time.monotonic() - t0 < 3


def test_the_scheduler_sees_the_validation_counterpart_of_a_final_metric():
    assert objective_key("final/val_loss") == "val/loss"
    assert objective_key("final/val_ppl") == "val/ppl"
    assert objective_key("final/accuracy") == "val/accuracy"
    assert objective_key("val/loss") == "val/loss"
