"""The tiny model's BPE vocabulary (terminal_rsi.models.bpe, issue 51): any text round-trips,
the byte tokenizer's chat format and special tokens at the same ids, a deterministic
vocabulary from the training split only, `model.tokenizer = "bpe"` through the loader (the
model's vocabulary follows it; a pretrained source refuses it) and one sampled episode."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace as NS

import ml_collections
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from terminal_rsi.agent import HarnessConfig, RolloutEngine, bpe_vocab
from terminal_rsi.models import bpe, loading, source
from terminal_rsi.models.tokenizer import ByteTokenizer, TokenizerError
from terminal_rsi.tasks import get_suite
from terminal_rsi.tasks.builtin import HELDOUT_FAMILIES, heldout_seed, instance, validation_seed

tokenizers = pytest.importorskip("tokenizers")

BT = ByteTokenizer()
TRICKY = ["", " ", "\n\n\t  x ", "grep -c ERROR app.log", "héllo wörld", "日本語のテキスト",
          "emoji 🙂👍🏽 and ZWJ 👩‍👩‍👧", "\x00\x01\x7f\r\n\x1b[31mred\x1b[0m", "a\u0301e\u0300",
          "\ufffd\ufeff", "1234567890 3.14 -42", "<|end|><|assistant|> <|nope|> <|", "   ",
          'x = {"a": [1, 2]}\n' * 3, "\U0010ffff\U0001f600"]


@pytest.fixture(scope="module")
def tok():
    return bpe.tiny_bpe()


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_text_round_trips_and_no_special_comes_from_text(text):
    tok = bpe.tiny_bpe()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert not set(ids) & set(tok.id_to_special)
    assert all(0 <= i < tok.vocab_size for i in ids)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64))
def test_observation_bytes_round_trip(raw):
    """Sandbox output is bytes decoded with replacement; whatever it becomes round-trips."""
    text = raw.decode("utf-8", errors="replace")
    assert bpe.tiny_bpe().decode(bpe.tiny_bpe().encode(text)) == text


def test_tricky_texts_round_trip_and_byte_chars_are_the_byte_level_alphabet(tok):
    for text in TRICKY:
        assert tok.decode(tok.encode(text)) == text, text
        assert tok.decode(tok.encode(text, allow_special=True), skip_special=False) == text
    chars = bpe.byte_chars()
    assert sorted(chars) == sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    level = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    for text in ["a", "~", " ", "\n", "é", "🙂", "\x00"]:
        mapped = "".join(chars[b] for b in text.encode("utf-8"))
        assert level.pre_tokenize_str(text)[0][0] == mapped
    assert tok.encode("7") == [ord("7")] and tok.decode([0xC3, 0xA9]) == "é"  # ids = bytes
    assert len(tok.encode("2024")) == 4  # digits one by one


def test_specials_are_single_ids_at_the_byte_tokenizers_ids(tok):
    assert tok.special_ids == BT.special_ids and tok.stop_ids == BT.stop_ids
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.end_id) == (BT.pad_id, BT.bos_id,
                                                               BT.eos_id, BT.end_id)
    for special, i in tok.special_ids.items():
        assert tok.encode(special, allow_special=True) == [i]
        assert tok.encode(f"a{special}b", allow_special=True)[1:-1] == [i]
        assert i not in tok.encode(special) and tok.decode(tok.encode(special)) == special
        assert tok.token_to_id(special) == i
    assert tok.token_to_id(" ERROR") >= 264 and tok.token_to_id("a") == ord("a")
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])
    with pytest.raises(TokenizerError, match="not a token"):
        tok.token_to_id("certainly not one token")


def test_chat_rendering_has_the_byte_tokenizers_structure(tok):
    msgs = [{"role": "system", "content": "Solve the task in a Linux shell."},
            {"role": "user", "content": "Task:\nCount the ERROR lines of app.log."},
            {"role": "assistant", "content": '{"commands":["grep -c ERROR app.log"]}'},
            {"role": "tool", "content": "$ grep -c ERROR app.log\n3\n[exit code 0]"}]
    for gen in (True, False):
        ids, ref = tok.render(msgs, gen), BT.render(msgs, gen)
        assert [i for i in ids if i in tok.id_to_special] == [
            i for i in ref if i in BT.id_to_special]
        assert tok.decode(ids) == BT.decode(ref)
        assert len(ids) < len(ref) / 2
    with pytest.raises(TokenizerError, match="unknown chat role"):
        tok.render([{"role": "narrator", "content": "x"}])


def test_compression_on_task_instructions(tok):
    """Printed, not asserted beyond "shorter": tokens per byte of a few instructions."""
    rows = []
    for family in ("create_file", "log_pipeline", "grep_files", "config_edit"):
        text = instance(family, 1).instruction
        n = len(text.encode("utf-8"))
        rows.append(f"{family}: {len(tok.encode(text))}/{n} = {len(tok.encode(text)) / n:.2f}")
        assert len(tok.encode(text)) < n
    print("tokens per byte: " + "; ".join(rows))


def test_the_corpus_holds_only_training_seeds_of_training_families():
    fams = bpe_vocab.training_families()
    assert not set(fams) & set(HELDOUT_FAMILIES) and "interrupt_and_redo" not in fams
    assert "persistent_shell" in fams and "create_file" in fams
    for family in fams:
        for seed in bpe_vocab.training_seeds(family, bpe_vocab.N_PER_FAMILY):
            assert not heldout_seed(family, seed) and not validation_seed(family, seed)
    held = next(s for s in range(100) if heldout_seed("create_file", s))
    text = "\n".join(bpe_vocab.corpus(3))
    assert instance("create_file", bpe_vocab.training_seeds("create_file", 1)[0]
                    ).instruction in text
    assert instance("create_file", held).instruction not in text
    assert instance("column_sum", 0).instruction not in text


TRAIN_CHILD = """
import json, sys
from terminal_rsi.models.bpe import train_bpe
sys.stdout.write(train_bpe(json.load(open(sys.argv[1])), int(sys.argv[2])))
"""


def test_training_is_deterministic_and_the_shipped_vocabulary_is_laid_out_by_it(tmp_path, tok):
    """The same texts give the same file, in this process and in another (the Rust trainer's
    hash maps are seeded per process); the shipped file has the layout and steps a build
    writes (regenerating it in full: `python -m terminal_rsi.agent.bpe_vocab --check`)."""
    texts = list(bpe_vocab.corpus(2))
    small = bpe.train_bpe(texts, 400)
    assert bpe.train_bpe(texts, 400) == small == bpe_vocab.build(400, 2)
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps(texts))
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    child = subprocess.run([sys.executable, "-c", TRAIN_CHILD, str(path), "400"], env=env,
                           capture_output=True, text=True, timeout=300, check=True)
    assert child.stdout == small
    built = bpe.BPETokenizer(small)
    assert built.vocab_size == 400 and built.pieces[:264] == tok.pieces[:264]
    with open(bpe.TINY_BPE_PATH, encoding="utf-8") as f:
        shipped = json.load(f)
    fresh = json.loads(small)
    assert {k: v for k, v in shipped.items() if k != "model"} == {
        k: v for k, v in fresh.items() if k != "model"}
    assert tok.vocab_size == bpe.TINY_BPE_VOCAB == len(shipped["model"]["vocab"])
    shifted = {t: (i + 1) % 400 for t, i in fresh["model"]["vocab"].items()}
    with pytest.raises(TokenizerError, match="laid out"):  # ids 0..255 must be the bytes
        bpe.BPETokenizer(json.dumps({**fresh, "model": {**fresh["model"], "vocab": shifted}}))


def _config(**model):
    m = {"preset": "tiny", "tokenizer": "bpe", "vocab_size": None, "d_model": 32,
         "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "head_dim": 16, "d_ff": 64,
         "max_seq_len": 1024, "gguf": None, "hf": None}
    m.update(model)
    return ml_collections.ConfigDict({"seed": 3, "model": m, "init": {"actor_weights": None}})


def test_load_model_with_bpe_sizes_the_vocabulary_to_it(tok):
    m = loading.load_model(_config())
    assert m.tokenizer is tok and m.config.vocab_size == tok.vocab_size == 1024
    assert loading.load_model(_config(vocab_size=1280)).config.vocab_size == 1280
    with pytest.raises(source.ModelSourceError, match="config.model.vocab_size"):
        loading.load_model(_config(vocab_size=384))
    assert isinstance(loading.load_model(_config(tokenizer="byte")).tokenizer, ByteTokenizer)
    for field in ("gguf", "hf"):  # a typed error naming both settings, before any file check
        with pytest.raises(source.ModelSourceError,
                           match=rf"config\.model\.tokenizer = 'bpe'.*config\.model\.{field}"):
            source.check_model_source(_config(**{field: "/no/such/model"}))


def test_one_sampled_episode_with_the_bpe_model():
    model = loading.load_model(_config(), params=True)
    harness = HarnessConfig(name="H0", max_turns=1, max_output_tokens=12,
                            max_input_tokens=1024, summarize_threshold=None, temperature=1.0)
    engine = RolloutEngine(harness, None, concurrency=1, model=model,
                           rollout=NS(decode_block=8, prefill_chunk=128, cache_multiple=64))
    tasks = list(get_suite("builtin", "train", families=["create_file"], n_per_family=1))
    done = engine.run(engine.policy(model.params, seed=0), tasks)
    (traj,) = done.trajectories
    ids = traj.turns[0].sampled_ids
    assert 0 < len(ids) <= 12 and all(0 <= i < 1024 for i in ids)
    prompt = traj.prompt_at(0)
    assert prompt[0] == model.tokenizer.bos_id and prompt[-1] == model.tokenizer.special_ids[
        "<|assistant|>"]
    assert tasks[0].instruction in model.tokenizer.decode(prompt)
