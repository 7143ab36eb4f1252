"""Tokenizers: the built-in chat format (`ChatTokenizer`) with byte tokens (`ByteTokenizer`;
`models.bpe.BPETokenizer` adds a small BPE vocabulary to it), and a Hugging Face `tokenizers`
adapter (`HFTokenizer`).

All expose the same small interface used by the harness and the sampler:

    vocab_size, bos_id, eos_id, pad_id, stop_ids
    encode(text, allow_special=False) -> list[int]
    decode(ids, skip_special=False) -> str
    render(messages, add_generation_prompt=True) -> list[int]   # chat template

Token-in/token-out: sampled token ids are stored and reused exactly as sampled. The harness
appends the sampled ids to the context and tokenizes only *new* text (observations, the
prompt); nothing re-tokenizes generated text, because decode→encode is not an identity for
BPE vocabularies and would change the log-probabilities PPO needs. `decode` is for display
and for parsing actions only.

`encode(..., allow_special=False)` (the default) never produces special tokens from text,
so an observation containing "<|assistant|>" cannot forge a turn boundary; templates are
rendered with special tokens on.

`tokenizers` and `jinja2` are imported where used.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from terminal_rsi.models.weights import gguf_metadata, open_gguf


class TokenizerError(ValueError):
    """A tokenizer file, vocabulary or chat template is missing or malformed."""


class Tokenizer(Protocol):
    vocab_size: int
    bos_id: int | None
    eos_id: int
    pad_id: int
    stop_ids: tuple[int, ...]

    def encode(self, text: str, allow_special: bool = False) -> list[int]: ...
    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str: ...
    def render(self, messages: Sequence[Mapping[str, str]],
               add_generation_prompt: bool = True) -> list[int]: ...


# ----------------------------------------------------------------------------- bytes


class ChatTokenizer:
    """The chat format and special tokens of the built-in tokenizers (`ByteTokenizer`,
    `models.bpe.BPETokenizer`): ids 0..255 are the 256 bytes (id = byte value), 256..263 the
    special tokens, and a subclass may add multi-byte tokens after them (`pieces`: the bytes
    of every id, None for a special). A subclass gives `encode_text` (text -> ids, never a
    special); `encode(..., allow_special=True)` splits out the special-token strings first.

    Chat format: <|bos|> then per message `<|role|>` + the encoded content + `<|end|>`,
    and, with add_generation_prompt, a final `<|assistant|>`. Roles: system, user, assistant,
    observation ("tool" is an alias of observation). Generation stops at <|end|> or <|eos|>.
    """

    SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>",
                "<|observation|>", "<|end|>")
    ROLE_ALIASES = {"tool": "observation"}
    SPECIAL_RE = re.compile("(" + "|".join(re.escape(t) for t in SPECIALS) + ")")

    def __init__(self, extra_pieces: Sequence[bytes] = ()):
        self.special_ids = {tok: 256 + i for i, tok in enumerate(self.SPECIALS)}
        self.id_to_special = {i: t for t, i in self.special_ids.items()}
        self.pieces: list[bytes | None] = ([bytes([b]) for b in range(256)]
                                           + [None] * len(self.SPECIALS) + list(extra_pieces))
        self.vocab_size = len(self.pieces)
        self.pad_id = self.special_ids["<|pad|>"]
        self.bos_id = self.special_ids["<|bos|>"]
        self.eos_id = self.special_ids["<|eos|>"]
        self.end_id = self.special_ids["<|end|>"]
        self.stop_ids = (self.end_id, self.eos_id)

    def encode_text(self, text: str) -> list[int]:
        raise NotImplementedError

    def token_to_id(self, token: str) -> int:
        """The id of a special token, or of the token whose bytes are `token`'s UTF-8."""
        if token in self.special_ids:
            return self.special_ids[token]
        raw = token.encode("utf-8")
        try:
            return self.pieces.index(raw)
        except ValueError:
            raise TokenizerError(f"{token!r} is not a token of the vocabulary or a special "
                                 "token") from None

    def role_id(self, role: str) -> int:
        role = self.ROLE_ALIASES.get(role, role)
        tok = f"<|{role}|>"
        if tok not in self.special_ids or role in ("pad", "bos", "eos", "end"):
            raise TokenizerError(f"unknown chat role {role!r}; use system, user, assistant, "
                                 "observation (or tool)")
        return self.special_ids[tok]

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Ids of `text` (`encode_text`); with allow_special, special-token strings map to
        their ids."""
        if not allow_special:
            return self.encode_text(text)
        out: list[int] = []
        for k, part in enumerate(self.SPECIAL_RE.split(text)):
            if k % 2:  # the split's captured group: a special token
                out.append(self.special_ids[part])
            elif part:
                out.extend(self.encode_text(part))
        return out

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Bytes back to text (invalid UTF-8 replaced); specials as their strings or skipped."""
        parts: list[str] = []
        buf = bytearray()
        for i in ids:
            i = int(i)
            piece = self.pieces[i] if 0 <= i < self.vocab_size else None
            if piece is not None:
                buf += piece
                continue
            if i not in self.id_to_special:
                raise TokenizerError(f"token id {i} is outside the vocabulary "
                                     f"[0, {self.vocab_size})")
            parts.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
            if not skip_special:
                parts.append(self.id_to_special[i])
        parts.append(buf.decode("utf-8", errors="replace"))
        return "".join(parts)

    def render(self, messages: Sequence[Mapping[str, str]],
               add_generation_prompt: bool = True) -> list[int]:
        ids = [self.bos_id]
        for m in messages:
            ids.append(self.role_id(m["role"]))
            ids.extend(self.encode(m["content"]))
            ids.append(self.end_id)
        if add_generation_prompt:
            ids.append(self.special_ids["<|assistant|>"])
        return ids


class ByteTokenizer(ChatTokenizer):
    """256 byte tokens (id = byte value) followed by the special tokens (`ChatTokenizer`: its
    chat format): the content of a message is its UTF-8 bytes."""

    def encode_text(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


# ----------------------------------------------------------------------------- HF tokenizers

# GGUF `tokenizer.ggml.pre` -> pre-tokenizer regex (llama.cpp's names).
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"
                 r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?"
                r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _pre_tokenizer(pre: str):
    # Hugging Face tokenizers: optional, loaded when an HF tokenizer is built
    from tokenizers import Regex, pre_tokenizers

    if pre in ("smollm", "starcoder", "refact"):
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in ("llama-bpe", "llama3", "qwen2", "deepseek-llm"):
        regex = _QWEN2_REGEX if pre == "qwen2" else _LLAMA3_REGEX
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _render_template(template: str, messages, add_generation_prompt: bool, **extra) -> str:
    import jinja2.ext  # chat templates: optional, loaded when an HF tokenizer is built
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TokenizerError(f"chat template error: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent,
                                                                  ensure_ascii=False)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=list(messages), add_generation_prompt=add_generation_prompt, **extra)


def _generation_stop_tokens(tok, folder: str) -> list[str]:
    """The stop tokens of a model folder's generation_config.json: `eos_token_id`, one id or a
    list (Hugging Face generation stops at any of them); [] without the file."""
    path = os.path.join(folder, "generation_config.json")
    if not os.path.exists(path):
        return []
    try:
        with open(path, encoding="utf-8") as f:
            ids = json.load(f).get("eos_token_id")
    except (OSError, ValueError, AttributeError) as e:
        raise TokenizerError(f"{path} is not a JSON object ({e}); fix or remove it") from None
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    out = []
    for i in ids:
        t = tok.id_to_token(i) if isinstance(i, int) else None
        if t is None:
            raise TokenizerError(f"{path}: eos_token_id {i!r} is not a token id of the "
                                 "vocabulary; fix generation_config.json")
        out.append(t)
    return out


class HFTokenizer:
    """Adapter over a `tokenizers.Tokenizer` with a Jinja chat template.

    Build with `from_file(tokenizer.json)` (special tokens and template also read from a
    `tokenizer_config.json` next to it, if any) or `from_gguf(path)` (BPE vocabulary, merges,
    token types and `tokenizer.chat_template` from GGUF metadata).
    """

    def __init__(self, tokenizer, *, chat_template: str | None = None,
                 bos_token: str | None = None, eos_token: str | None = None,
                 pad_token: str | None = None, stop_tokens: Sequence[str] = (),
                 add_bos: bool = False):
        self.tok = tokenizer
        self.chat_template = chat_template
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.bos_token, self.eos_token = bos_token, eos_token
        self.bos_id = self._id(bos_token) if bos_token else None
        if eos_token is None:
            raise TokenizerError("the tokenizer has no EOS token; pass eos_token=...")
        self.eos_id = self._id(eos_token)
        self.pad_id = self._id(pad_token) if pad_token else self.eos_id
        self.stop_ids = tuple(dict.fromkeys([self.eos_id] + [self._id(t) for t in stop_tokens]))
        self.add_bos = add_bos
        # encode() toggles the shared `encode_special_tokens` flag: one encode at a time, so
        # that concurrent episodes (threads) never render a template with specials as text
        self._encode_lock = threading.Lock()

    def _id(self, token: str) -> int:
        i = self.tok.token_to_id(token)
        if i is None:
            raise TokenizerError(f"token {token!r} is not in the vocabulary")
        return i

    def token_to_id(self, token: str) -> int:
        return self._id(token)

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        """Ids of `text`. Without allow_special, special-token strings are split as text.
        Thread-safe."""
        with self._encode_lock:
            # encode_special_tokens=True makes the tokenizer treat special strings as text
            self.tok.encode_special_tokens = not allow_special
            try:
                return list(self.tok.encode(text, add_special_tokens=False).ids)
            finally:
                self.tok.encode_special_tokens = False

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def render_text(self, messages: Sequence[Mapping[str, str]],
                    add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise TokenizerError("this tokenizer has no chat template; pass chat_template=... "
                                 "or use a tokenizer_config.json / GGUF that carries one")
        return _render_template(self.chat_template, messages, add_generation_prompt,
                                bos_token=self.bos_token or "", eos_token=self.eos_token)

    def render(self, messages: Sequence[Mapping[str, str]],
               add_generation_prompt: bool = True) -> list[int]:
        """Chat-template text of `messages`, tokenized with special tokens recognized."""
        ids = self.encode(self.render_text(messages, add_generation_prompt), allow_special=True)
        if self.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id] + ids
        return ids

    # -- constructors

    @classmethod
    def from_file(cls, path: str, chat_template: str | None = None, **kwargs) -> HFTokenizer:
        """From tokenizer.json (plus tokenizer_config.json, for special tokens, the chat template
        and add_bos_token, and generation_config.json, for the stop tokens, in the same
        folder, if present)."""
        # Hugging Face tokenizers: optional, loaded when an HF tokenizer is built
        from tokenizers import Tokenizer as HFTok

        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.exists(path):
            raise TokenizerError(f"no tokenizer file at {path}")
        tok = HFTok.from_file(path)
        cfg_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
        cfg: dict[str, Any] = {}
        if os.path.exists(cfg_path):
            with open(cfg_path, encoding="utf-8") as f:
                cfg = json.load(f)

        def tok_str(x):
            return x.get("content") if isinstance(x, dict) else x

        opts = dict(chat_template=chat_template or cfg.get("chat_template"),
                    bos_token=tok_str(cfg.get("bos_token")),
                    eos_token=tok_str(cfg.get("eos_token")),
                    pad_token=tok_str(cfg.get("pad_token")),
                    stop_tokens=_generation_stop_tokens(tok, os.path.dirname(path)),
                    add_bos=bool(cfg.get("add_bos_token", False)))
        opts.update(kwargs)
        return cls(tok, **opts)

    @classmethod
    def from_gguf(cls, path_or_reader, **kwargs) -> HFTokenizer:
        """Byte-level BPE ("gpt2" GGUF tokenizer model) rebuilt from GGUF metadata."""
        # Hugging Face tokenizers: optional, loaded when an HF tokenizer is built
        from tokenizers import AddedToken, decoders, models
        from tokenizers import Tokenizer as HFTok

        reader = open_gguf(path_or_reader)
        meta = gguf_metadata(reader, prefix="tokenizer.")
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise TokenizerError(f"GGUF tokenizer model {kind!r} is not supported (only byte-"
                                 "level BPE, 'gpt2'); load the tokenizer.json instead")
        tokens = meta["tokenizer.ggml.tokens"]
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = HFTok(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
        tok.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
        tok.decoder = decoders.ByteLevel()
        specials = [AddedToken(t, special=True, normalized=False)
                    for t, ty in zip(tokens, types, strict=True) if ty in (3, 4)]
        tok.add_special_tokens(specials)

        def name(key):
            i = meta.get(f"tokenizer.ggml.{key}_token_id")
            return tokens[i] if i is not None else None

        stop = [t for t in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>")
                if t in vocab]
        opts = dict(chat_template=meta.get("tokenizer.chat_template"), bos_token=name("bos"),
                    eos_token=name("eos"), pad_token=name("padding"), stop_tokens=stop,
                    add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)))
        opts.update(kwargs)
        return cls(tok, **opts)
