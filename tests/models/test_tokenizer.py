"""Byte tokenizer and the HF `tokenizers` adapter (tokenizer.json and GGUF vocabularies)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from terminal_rsi.models.tokenizer import ByteTokenizer, HFTokenizer, TokenizerError

from .reference import CHAT_TEMPLATE, CORPUS, train_bpe, write_gguf

BT = ByteTokenizer()


@settings(max_examples=50, deadline=None)
@given(st.text())
def test_byte_roundtrip_and_no_specials_from_text(text):
    ids = BT.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert BT.decode(ids) == text


def test_byte_specials_and_chat_render():
    assert BT.vocab_size == 264 and len(set(BT.special_ids.values())) == 8
    assert BT.encode("a<|end|>", allow_special=True) == [97, BT.end_id]
    assert BT.encode("a<|end|>") == list(b"a<|end|>")
    assert BT.encode("x<|nope|>", allow_special=True) == list(b"x<|nope|>")
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ok"}, {"role": "tool", "content": "$ ls"}]
    ids = BT.render(msgs)
    sp = BT.special_ids
    want = ([BT.bos_id, sp["<|system|>"]] + list(b"be brief") + [BT.end_id, sp["<|user|>"]]
            + list(b"hi") + [BT.end_id, sp["<|assistant|>"]] + list(b"ok") + [BT.end_id,
            sp["<|observation|>"]] + list(b"$ ls") + [BT.end_id, sp["<|assistant|>"]])
    assert ids == want
    assert BT.decode(ids, skip_special=True) == "be briefhiok$ ls"
    assert BT.stop_ids == (BT.end_id, BT.eos_id)
    with pytest.raises(TokenizerError, match="unknown chat role"):
        BT.render([{"role": "narrator", "content": "x"}])
    with pytest.raises(TokenizerError, match="outside"):
        BT.decode([9999])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    pytest.importorskip("tokenizers")
    tok = train_bpe()
    folder = tmp_path_factory.mktemp("tok")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHAT_TEMPLATE, "eos_token": {"content": "<|im_end|>"},
        "bos_token": None, "pad_token": "<|endoftext|>"}))
    return tok, folder


def test_hf_tokenizer_file_roundtrip_and_template(trained):
    tok, folder = trained
    hf = HFTokenizer.from_file(str(folder))
    for text in CORPUS[:4]:
        ids = hf.encode(text)
        assert ids == tok.encode(text, add_special_tokens=False).ids
        assert hf.decode(ids) == text
    assert hf.eos_id == tok.token_to_id("<|im_end|>")
    assert hf.pad_id == tok.token_to_id("<|endoftext|>")
    ids = hf.render([{"role": "user", "content": "Paris?"}])
    start, end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    assert ids[0] == start and ids.count(end) == 1 and ids.count(start) == 2
    assert hf.decode(ids) == "<|im_start|>user\nParis?<|im_end|>\n<|im_start|>assistant\n"
    # Special strings inside text are not turned into control tokens by default.
    assert end not in hf.encode("fake <|im_end|> marker")
    assert end in hf.encode("fake <|im_end|> marker", allow_special=True)


def test_hf_tokenizer_from_gguf_matches_original(trained, tmp_path):
    pytest.importorskip("gguf")
    from terminal_rsi.models.config import ModelConfig

    from .reference import random_hf_weights

    tok, _ = trained
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(with_added_tokens=True), d_model=16,
                      n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=16)
    path = str(tmp_path / "m.gguf")
    write_gguf(path, random_hf_weights(cfg), cfg, tok)
    hf = HFTokenizer.from_gguf(path)
    for text in CORPUS[:4] + ["<|im_start|>user\nhi<|im_end|>"]:
        assert hf.encode(text, allow_special=True) == tok.encode(text).ids
    assert hf.vocab_size == cfg.vocab_size
    assert hf.render([{"role": "user", "content": "x"}]) == tok.encode(
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n").ids
    assert tok.token_to_id("<|im_end|>") in hf.stop_ids


def test_missing_template_and_file_errors(trained, tmp_path):
    tok, _ = trained
    hf = HFTokenizer(tok, eos_token="<|im_end|>")
    with pytest.raises(TokenizerError, match="no chat template"):
        hf.render([{"role": "user", "content": "x"}])
    with pytest.raises(TokenizerError, match="no tokenizer file"):
        HFTokenizer.from_file(str(tmp_path / "nope.json"))
    with pytest.raises(TokenizerError, match="not in the vocabulary"):
        HFTokenizer(tok, eos_token="<|missing|>")


def test_hf_encode_is_thread_safe(trained):
    """Episodes run in threads: a script's plain-text encode (special strings as text) must
    never leak into a concurrent template render (special strings as control tokens)."""
    import concurrent.futures as cf

    tok, folder = trained
    hf = HFTokenizer.from_file(str(folder))
    msgs = [{"role": "user", "content": "hi"}]
    want_render = hf.render(msgs)
    want_plain = hf.encode("a <|im_end|> b " * 20)

    def work(i):
        return hf.render(msgs) if i % 2 else hf.encode("a <|im_end|> b " * 20)

    with cf.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(work, range(400)))
    assert all(g == (want_render if i % 2 else want_plain) for i, g in enumerate(got))
