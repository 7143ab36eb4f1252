"""A small byte-level BPE vocabulary for the tiny model, beside the byte tokenizer (issue 51).

`model.tokenizer = "bpe"` (a preset without model.gguf / model.hf) makes `load_model` build
the model with `tiny_bpe()`, the vocabulary shipped as package data (`TINY_BPE_PATH`), and a
vocabulary of its size (unless `model.vocab_size` is set). A word of the task distribution is
one or two tokens instead of 5-8 bytes, so a command copied from an instruction is a few
tokens to copy.

`BPETokenizer` keeps `ByteTokenizer`'s chat format and special tokens (`ChatTokenizer`), at
the same ids: 0..255 are the bytes, 256..263 the specials, and 264.. the merged tokens in the
order of their merges. Text is split into pre-tokens as GPT-2 splits it (byte-level: each
byte a symbol, so any text, whatever its bytes, encodes and decodes back exactly), with
digits one by one (a number is its digits, never a token learned from one instance), then the
merges apply within each pre-token; specials never come from text (`ChatTokenizer.encode`).
Encoding uses the Hugging Face `tokenizers` library (the "models" extra); decoding is a table
lookup.

`train_bpe(texts, vocab_size)` trains such a vocabulary (the `tokenizers` BPE trainer, then
the ids laid out as above): the same texts give the same file, byte for byte. The shipped one
is trained on the task distribution's training split by `python -m
terminal_rsi.agent.bpe_vocab --write` (`terminal_rsi.agent.bpe_vocab`: what it is trained
on). It is frozen: token ids are what weights are trained on, so weights trained with one
vocabulary do not fit another; regenerate it only to start over.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable

from terminal_rsi.models.tokenizer import ChatTokenizer, TokenizerError

TINY_BPE_VOCAB = 1024  # tokens of the shipped vocabulary: 256 bytes, 8 specials, 760 merges
TINY_BPE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets",
                             "tiny_bpe.json")
MIN_FREQUENCY = 2  # a pair seen once in the corpus is not merged


def byte_chars() -> list[str]:
    """The character that stands for each byte (index: the byte) in a byte-level BPE
    vocabulary: GPT-2's `bytes_to_unicode`, which the `tokenizers` ByteLevel steps use."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def _tokenizers():
    try:
        import tokenizers  # the "models" extra: loaded when a BPE vocabulary is built or read
    except ImportError:
        raise TokenizerError("model.tokenizer = 'bpe' needs the Hugging Face tokenizers "
                             "package: pip install 'tokenizers>=0.19' (the models extra)"
                             ) from None
    return tokenizers


def _pipeline(tk, model):
    """A `tokenizers.Tokenizer` of BPE `model` with this module's pre-tokenizer and decoder."""
    tok = tk.Tokenizer(model)
    tok.pre_tokenizer = tk.pre_tokenizers.Sequence([
        tk.pre_tokenizers.Digits(individual_digits=True),
        tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = tk.decoders.ByteLevel()
    return tok


def _trained_merges(tk, texts: list[str], size: int) -> list[tuple[str, str]]:
    tok = _pipeline(tk, tk.models.BPE())
    trainer = tk.trainers.BpeTrainer(vocab_size=size, min_frequency=MIN_FREQUENCY,
                                     show_progress=False, special_tokens=[],
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return [tuple(m) for m in json.loads(tok.to_str())["model"]["merges"]]


def _laid_out(merges: list[tuple[str, str]], vocab_size: int):
    """(vocab, merges) with this module's ids: bytes, specials, then each merge's new token
    in merge order, cut at `vocab_size` tokens (a prefix of merges is a valid BPE)."""
    vocab = {c: b for b, c in enumerate(byte_chars())}
    vocab.update((t, 256 + i) for i, t in enumerate(ChatTokenizer.SPECIALS))
    kept = []
    for a, b in merges:
        if len(vocab) >= vocab_size:
            break
        if a + b in ChatTokenizer.SPECIALS:  # pre-tokens split them: cannot happen
            raise TokenizerError(f"a merge makes the special token {a + b!r}")
        vocab.setdefault(a + b, len(vocab))  # two merges may make the same token
        kept.append((a, b))
    return vocab, kept


def train_bpe(texts: Iterable[str], vocab_size: int = TINY_BPE_VOCAB) -> str:
    """The tokenizer.json text of a byte-level BPE of at most `vocab_size` tokens (bytes and
    specials included) trained on `texts` (module doc). Deterministic."""
    tk = _tokenizers()
    texts = list(texts)
    floor = 256 + len(ChatTokenizer.SPECIALS)
    if vocab_size < floor:
        raise TokenizerError(f"vocab_size {vocab_size} < {floor} (the bytes and specials)")
    size = vocab_size - len(ChatTokenizer.SPECIALS)
    while True:  # ask for more merges while repeated tokens leave the vocabulary short
        merges = _trained_merges(tk, texts, size)
        vocab, kept = _laid_out(merges, vocab_size)
        if len(vocab) >= vocab_size or len(merges) < size - 256:  # full, or out of pairs
            break
        size += vocab_size - len(vocab)
    tok = _pipeline(tk, tk.models.BPE(vocab=vocab, merges=kept, ignore_merges=False))
    return tok.to_str(pretty=True) + "\n"


class BPETokenizer(ChatTokenizer):
    """A byte-level BPE vocabulary laid out as `train_bpe` writes it (module doc), with
    `ByteTokenizer`'s chat format and special tokens. Thread-safe."""

    def __init__(self, tokenizer_json: str):
        tk = _tokenizers()
        tok = tk.Tokenizer.from_str(tokenizer_json)
        by_id = {i: t for t, i in tok.get_vocab(with_added_tokens=False).items()}
        chars = byte_chars()
        n = len(chars) + len(self.SPECIALS)
        expect = {**dict(enumerate(chars)), **{256 + i: t for i, t in enumerate(self.SPECIALS)}}
        if sorted(by_id) != list(range(len(by_id))) or any(
                by_id.get(i) != t for i, t in expect.items()):
            raise TokenizerError("not a vocabulary laid out by terminal_rsi.models.bpe."
                                 "train_bpe (ids 0..255 the bytes, 256..263 the specials)")
        back = {c: b for b, c in enumerate(chars)}
        super().__init__([bytes(back[c] for c in by_id[i]) for i in range(n, len(by_id))])
        self.tok = tok

    @classmethod
    def from_file(cls, path: str) -> BPETokenizer:
        if not os.path.exists(path):
            raise TokenizerError(f"no BPE vocabulary at {path}")
        with open(path, encoding="utf-8") as f:
            return cls(f.read())

    def encode_text(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids) if text else []


@functools.cache
def tiny_bpe() -> BPETokenizer:
    """The shipped vocabulary (`TINY_BPE_PATH`), read once per process."""
    return BPETokenizer.from_file(TINY_BPE_PATH)
