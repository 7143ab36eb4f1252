"""TERMINAL_RSI_DISTRIBUTED=1 (set by every launcher) turns multi-host initialization on for
configs without a `distributed` section; without it nothing changes."""

from __future__ import annotations

import jax
import ml_collections
import pytest

from terminal_rsi.config.configuration import distributed_config
from terminal_rsi.runtime import sharding


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: seen.append(kw))
    for k in ("TERMINAL_RSI_DISTRIBUTED", "TERMINAL_RSI_COORDINATOR_ADDRESS",
              "TERMINAL_RSI_NUM_PROCESSES", "TERMINAL_RSI_PROCESS_ID"):
        monkeypatch.delenv(k, raising=False)
    return seen


def test_env_forces_initialization_with_env_wiring(calls, monkeypatch):
    config = ml_collections.ConfigDict({"experiment": "x", "seed": 0})
    assert sharding.maybe_initialize_distributed(config) is False and calls == []
    monkeypatch.setenv("TERMINAL_RSI_DISTRIBUTED", "1")
    monkeypatch.setenv("TERMINAL_RSI_COORDINATOR_ADDRESS", "node0:12355")
    monkeypatch.setenv("TERMINAL_RSI_NUM_PROCESSES", "4")
    monkeypatch.setenv("TERMINAL_RSI_PROCESS_ID", "3")
    assert sharding.maybe_initialize_distributed(config) is True
    assert calls == [{"coordinator_address": "node0:12355", "num_processes": 4,
                      "process_id": 3}]


def test_env_forces_a_disabled_section_and_tpu_autodetection(calls, monkeypatch):
    config = ml_collections.ConfigDict({"distributed": distributed_config()})
    assert sharding.maybe_initialize_distributed(config) is False
    monkeypatch.setenv("TERMINAL_RSI_DISTRIBUTED", "1")
    assert sharding.maybe_initialize_distributed(config) is True
    assert calls == [{"coordinator_address": None, "num_processes": None, "process_id": None}]


def test_one_process_is_a_no_op(calls, monkeypatch):
    monkeypatch.setenv("TERMINAL_RSI_DISTRIBUTED", "1")
    monkeypatch.setenv("TERMINAL_RSI_NUM_PROCESSES", "1")
    assert sharding.maybe_initialize_distributed({}) is False and calls == []
