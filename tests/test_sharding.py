"""Mesh shapes, logical-axis rules, memory plan, multi-host hook, and the 8-device check."""

import atexit
import json
import math
import os
import subprocess
import sys

import jax
import pytest
from jax.sharding import PartitionSpec as P

from terminal_rsi.models.config import ModelConfig, get_model_config
from terminal_rsi.runtime import sharding as shd
from terminal_rsi.training import memory_plan as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _start_multidevice_check():
    """Start the 8-device check at collection time so it overlaps the other tests (it only
    needs a second core); `test_eight_devices_match_one_device` collects the result."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "multidevice_check.py")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    atexit.register(lambda: proc.poll() is None and proc.kill())
    return proc


_MULTIDEVICE = _start_multidevice_check()


def test_resolve_mesh_shape():
    assert shd.resolve_mesh_shape(None, 8) == {"data": 1, "fsdp": 8, "tensor": 1}
    assert shd.resolve_mesh_shape({"tensor": 2}, 8) == {"data": 4, "fsdp": 1, "tensor": 2}
    assert shd.resolve_mesh_shape({"data": 2, "fsdp": -1, "tensor": 2}, 8) == {
        "data": 2, "fsdp": 2, "tensor": 2}
    assert shd.resolve_mesh_shape((2, 2, 2), 8) == {"data": 2, "fsdp": 2, "tensor": 2}
    with pytest.raises(shd.MeshConfigError, match="available"):
        shd.resolve_mesh_shape((2, 2, 1), 8)
    with pytest.raises(shd.MeshConfigError, match="do not divide"):
        shd.resolve_mesh_shape({"tensor": 3}, 8)
    with pytest.raises(shd.MeshConfigError, match="unknown mesh axes"):
        shd.resolve_mesh_shape({"model": 2}, 8)
    mesh = shd.make_mesh()
    assert mesh.axis_names == shd.MESH_AXES and mesh.size == jax.device_count()


def test_logical_to_spec_rules():
    rules, mesh = shd.DEFAULT_RULES, {"data": 2, "fsdp": 4, "tensor": 2}
    assert shd.logical_to_spec(("embed", "heads", "head_dim"), (64, 8, 16), rules, mesh) == \
        P("fsdp", "tensor", None)
    # Not divisible -> replicated (SmolLM2's 3 KV heads on tensor=2).
    assert shd.logical_to_spec(("embed", "kv_heads", "head_dim"), (64, 3, 16), rules, mesh) == \
        P("fsdp", None, None)
    # A mesh axis is used at most once; size-1 axes are dropped.
    assert shd.logical_to_spec(("mlp", "mlp"), (8, 8), rules, mesh) == P("tensor", None)
    assert shd.logical_to_spec(("embed",), (64,), rules, {"fsdp": 1}) == P(None)
    assert shd.logical_to_spec(("batch", None), (8, 3), rules, mesh) == P(("data", "fsdp"), None)


def test_memory_plan_matches_hand_count():
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                      head_dim=8, d_ff=48)
    plan = mp.memory_plan(cfg, {"data": 2, "fsdp": 2, "tensor": 2})
    # Every matrix is split over fsdp x tensor (all dims divide), norms are replicated.
    d, f, v = 32, 48, 64
    matrices = v * d * 2 + cfg.n_layers * (d * 32 + 2 * d * 16 + 32 * d + 3 * d * f)
    norms = d * (2 * cfg.n_layers + 1)
    assert plan["num_params"] == cfg.num_params()
    assert plan["params_bytes"] == 4 * (matrices // 4 + norms)
    assert plan["opt_bytes"] == 2 * plan["params_bytes"] + 4  # mu, nu + int32 count
    big = mp.memory_plan(get_model_config("qwen3_27b_class"), {"fsdp": 64, "tensor": 4})
    n = get_model_config("qwen3_27b_class").num_params()
    assert big["num_params"] == n
    assert n * 4 / 256 <= big["params_bytes"] <= n * 4 / 256 * 1.01
    text = mp.format_memory_plan(big)
    assert "optimizer (AdamW mu, nu) per device" in text and "fsdp=64" in text
    assert "['layers'][*]" in text  # layers folded into one row per tensor


def test_maybe_initialize_distributed(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    assert not shd.maybe_initialize_distributed({"seed": 0})
    assert not shd.maybe_initialize_distributed({"distributed": {"enabled": False}})
    assert not shd.maybe_initialize_distributed(
        {"distributed": {"enabled": True, "num_processes": 1}})
    assert calls == []
    monkeypatch.setenv("TERMINAL_RSI_PROCESS_ID", "3")
    assert shd.maybe_initialize_distributed({"distributed": {
        "enabled": True, "coordinator_address": "10.0.0.1:1234", "num_processes": 4,
        "process_id": None}})
    assert calls == [{"coordinator_address": "10.0.0.1:1234", "num_processes": 4,
                      "process_id": 3}]


@pytest.mark.slow
def test_eight_devices_match_one_device():
    """Actor and critic init + one update on a (2, 2, 2) mesh == one device (1e-5)."""
    pytest.importorskip("safetensors")
    stdout, stderr = _MULTIDEVICE.communicate(timeout=600)
    assert _MULTIDEVICE.returncode == 0, stderr[-3000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    for a, b in zip(out["loss_one"], out["loss_eight"], strict=True):
        assert math.isclose(a, b, rel_tol=1e-5), out
    assert out["init_diff"] == 0.0
    assert out["param_diff"] <= 1e-5, out
    assert out["mu_diff"] <= 1e-5 and out["mu_max"] > 1e-2, out
    assert out["specs"] == {"actor_embed": "P('tensor', 'fsdp')",
                            "actor_mu_q": "P('fsdp', 'tensor', None)", "step": "P()"}
    assert out["embed_shards"] == 8
    assert out["hf_spec"] == "P('fsdp', 'tensor')" and out["hf_logit_diff"] < 1e-4


def test_distributed_config_section_validates():
    import ml_collections

    from terminal_rsi.config.configuration import (
        BASE_SCHEMA,
        DISTRIBUTED_SCHEMA,
        ConfigError,
        distributed_config,
        validate_config,
    )

    cfg = ml_collections.ConfigDict({"experiment": "x", "seed": 0,
                                     "distributed": distributed_config()})
    validate_config(cfg, {**BASE_SCHEMA, **DISTRIBUTED_SCHEMA})
    assert not shd.maybe_initialize_distributed(cfg)
    cfg.distributed.num_processes = 0
    with pytest.raises(ConfigError, match="distributed.num_processes"):
        validate_config(cfg, {**BASE_SCHEMA, **DISTRIBUTED_SCHEMA})
