"""Independent NumPy reference of a LLaMA/Qwen forward pass on HF-layout weights.

Written from the HF modeling code's definitions (not from terminal_rsi): q/k/v/o projections
as `x @ W.T`, rotate_half rotary, GQA by repeating kv heads, causal softmax per sequence.
"""

from __future__ import annotations

import numpy as np

from terminal_rsi.models.config import ModelConfig


def random_hf_weights(cfg: ModelConfig, seed: int = 0, scale: float = 0.3) -> dict:
    """Random HF-named float32 tensors for `cfg` (untied lm_head unless tie_embeddings)."""
    rng = np.random.default_rng(seed)
    d, h, k, hd, f, v = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff,
                         cfg.vocab_size)

    def r(*shape, s=None):
        return (rng.standard_normal(shape) * (s or scale / np.sqrt(shape[-1]) * 3)).astype(
            np.float32)

    w = {"model.embed_tokens.weight": r(v, d, s=0.5), "model.norm.weight": 1 + r(d, s=0.1)}
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + r(d, s=0.1)
        w[p + "post_attention_layernorm.weight"] = 1 + r(d, s=0.1)
        w[p + "self_attn.q_proj.weight"] = r(h * hd, d)
        w[p + "self_attn.k_proj.weight"] = r(k * hd, d)
        w[p + "self_attn.v_proj.weight"] = r(k * hd, d)
        w[p + "self_attn.o_proj.weight"] = r(d, h * hd)
        if cfg.attn_bias:
            for n, m in (("q", h), ("k", k), ("v", k)):
                w[p + f"self_attn.{n}_proj.bias"] = r(m * hd, s=0.1)
        if cfg.qk_norm:
            w[p + "self_attn.q_norm.weight"] = 1 + r(hd, s=0.1)
            w[p + "self_attn.k_norm.weight"] = 1 + r(hd, s=0.1)
        w[p + "mlp.gate_proj.weight"] = r(f, d)
        w[p + "mlp.up_proj.weight"] = r(f, d)
        w[p + "mlp.down_proj.weight"] = r(d, f)
    if not cfg.tie_embeddings:
        w["lm_head.weight"] = r(v, d)
    return w


def _rms(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _rope(x, pos, theta):
    """x [L, N, hd], pos [L]."""
    hd = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    fr = pos[:, None] * inv[None]
    emb = np.concatenate([fr, fr], -1)[:, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    rot = np.concatenate([-x2, x1], -1)
    return x * np.cos(emb) + rot * np.sin(emb)


def numpy_hidden(w: dict, cfg: ModelConfig, tokens) -> np.ndarray:
    """Final-normed hidden states [L, D] of ONE unpadded sequence (positions 0..L-1)."""
    tokens = np.asarray(tokens)
    n = len(tokens)
    h, k, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    x = w["model.embed_tokens.weight"].astype(np.float64)[tokens]
    pos = np.arange(n, dtype=np.float64)
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        def g(name, p=p):
            return w[p + name].astype(np.float64)

        a = _rms(x, g("input_layernorm.weight"), cfg.norm_eps)
        q = a @ g("self_attn.q_proj.weight").T
        kk = a @ g("self_attn.k_proj.weight").T
        vv = a @ g("self_attn.v_proj.weight").T
        if cfg.attn_bias:
            q = q + g("self_attn.q_proj.bias")
            kk = kk + g("self_attn.k_proj.bias")
            vv = vv + g("self_attn.v_proj.bias")
        q, kk, vv = q.reshape(n, h, hd), kk.reshape(n, k, hd), vv.reshape(n, k, hd)
        if cfg.qk_norm:
            q = _rms(q, g("self_attn.q_norm.weight"), cfg.norm_eps)
            kk = _rms(kk, g("self_attn.k_norm.weight"), cfg.norm_eps)
        q, kk = _rope(q, pos, cfg.rope_theta), _rope(kk, pos, cfg.rope_theta)
        rep = h // k
        kk, vv = np.repeat(kk, rep, axis=1), np.repeat(vv, rep, axis=1)
        out = np.zeros((n, h, hd))
        for head in range(h):
            s = q[:, head] @ kk[:, head].T / np.sqrt(hd)
            s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            out[:, head] = s @ vv[:, head]
        x = x + out.reshape(n, h * hd) @ g("self_attn.o_proj.weight").T
        m = _rms(x, g("post_attention_layernorm.weight"), cfg.norm_eps)
        gate = m @ g("mlp.gate_proj.weight").T
        up = m @ g("mlp.up_proj.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ g("mlp.down_proj.weight").T
    return _rms(x, w["model.norm.weight"].astype(np.float64), cfg.norm_eps)


def numpy_logits(w: dict, cfg: ModelConfig, tokens) -> np.ndarray:
    """Logits [L, V] of one unpadded sequence."""
    hidden = numpy_hidden(w, cfg, tokens)
    head = w["model.embed_tokens.weight"] if cfg.tie_embeddings else w["lm_head.weight"]
    return hidden @ head.astype(np.float64).T


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "ls -la /tmp && cat README.md | grep -n 'install'",
    "def f(x):\n    return x * 2  # 12345 numbers 67890",
    "Unicode: héllo wörld — naïve café ✓",
] * 20


def train_bpe(vocab_size: int = 330):
    """A small byte-level BPE `tokenizers.Tokenizer` with ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def write_gguf(path: str, hf_weights: dict, cfg, tok) -> None:
    """A GGUF file (llama arch, F32 tensors, Q/K permuted like llama.cpp) with tokenizer."""
    import gguf

    from terminal_rsi.models.weights import _gguf_name, permute_gguf_qk

    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    model = __import__("json").loads(tok.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_chat_template(CHAT_TEMPLATE)
    for name, arr in hf_weights.items():
        if name.endswith("q_proj.weight"):
            arr = permute_gguf_qk(arr, cfg.n_heads)
        elif name.endswith("k_proj.weight"):
            arr = permute_gguf_qk(arr, cfg.n_kv_heads)
        w.add_tensor(_gguf_name(name), np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tiny_gguf(path: str, seed: int = 0, **dims):
    """A tiny llama-architecture GGUF at `path`: a byte-level BPE (`train_bpe`, ChatML special
    tokens and CHAT_TEMPLATE) and random weights of a 1-layer model (`dims` override
    d_model 16, n_layers 1, n_heads 2, n_kv_heads 1, head_dim 8, d_ff 32, max_seq_len 2048).
    Returns (ModelConfig, HF-named weights, the `tokenizers.Tokenizer`)."""
    tok = train_bpe()
    shape = {"d_model": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "head_dim": 8,
             "d_ff": 32, "max_seq_len": 2048, **dims}
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(with_added_tokens=True), **shape)
    w = random_hf_weights(cfg, seed=seed)
    write_gguf(path, w, cfg, tok)
    return cfg, w, tok
