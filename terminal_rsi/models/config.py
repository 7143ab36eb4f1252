"""Model shapes: a frozen `ModelConfig` and named presets.

Presets (`get_model_config(name)`):

- `tiny`: the CPU default. Byte-level vocabulary (`ByteTokenizer`, 256 bytes plus
  special tokens, padded to 384 rows), 4 layers, d_model 256, about 3.3 M parameters.
  With `model.tokenizer = "bpe"` its vocabulary is the shipped BPE's (`models.bpe`, 1024
  tokens) instead.
- `smollm2_135m`: the LLaMA shape of SmolLM2-135M(-Instruct): 30 layers, d_model 576,
  9 query and 3 key/value heads of 64, SwiGLU 1536, rope θ 1e5, vocab 49152, tied embeddings.
- `qwen3_27b_class`: a dense Qwen3-style shape of about 27 B parameters (64 layers,
  d_model 5120, 40 query / 8 key-value heads of 128, SwiGLU 21504, QK-norm, rope θ 1e6,
  vocab 151936, untied), used abstractly for memory planning (`terminal_rsi.training.memory_plan`).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp


class ModelConfigError(ValueError):
    """A model config is inconsistent (e.g. heads do not divide) or an unknown preset name."""


LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # the projections of a layer
# model.tokenizer of a preset: the byte tokenizer, or the shipped BPE vocabulary (models.bpe)
TOKENIZERS = ("byte", "bpe")


def lora_targets_error(targets) -> str | None:
    """What is wrong with a tuple of LoRA targets (None: a non-empty subset of LORA_TARGETS)."""
    if not targets or any(t not in LORA_TARGETS for t in targets):
        return f"choose a non-empty subset of {LORA_TARGETS}, not {tuple(targets)!r}"
    return None


_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder-only transformer (actor backbone; the critic shares it).

    Attributes:
      vocab_size: rows of the embedding / columns of the unembedding.
      d_model: residual width D.
      n_layers: number of decoder blocks.
      n_heads: query heads H.
      n_kv_heads: key/value heads K (grouped-query attention; H % K == 0).
      head_dim: per-head width.
      d_ff: SwiGLU hidden width F.
      rope_theta: rotary base θ.
      tie_embeddings: unembedding = embeddingᵀ.
      norm_eps: RMSNorm epsilon.
      param_dtype: storage dtype of parameters ("float32", "bfloat16").
      dtype: compute dtype of matmuls and activations (logits and values are float32).
      max_seq_len: longest position the model is used at (KV cache default length).
      qk_norm: per-head RMSNorm on queries and keys before rotary (Qwen3).
      attn_bias: biases on the q/k/v projections (Qwen2).
      lora_rank: rank r of LoRA adapters on `lora_targets` (`terminal_rsi.models.lora`); 0:
        none (full fine-tuning).
      lora_alpha: LoRA scale numerator α (the adapters add (α / r)·x·a·b).
      lora_targets: which projections of every layer get adapters (q, k, v, o, gate, up,
        down).
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    norm_eps: float = 1e-5
    param_dtype: str = "float32"
    dtype: str = "float32"
    max_seq_len: int = 2048
    qk_norm: bool = False
    attn_bias: bool = False
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                     "d_ff", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ModelConfigError(f"ModelConfig.{name} = {getattr(self, name)} must be > 0")
        if self.n_heads % self.n_kv_heads:
            raise ModelConfigError(
                f"ModelConfig.n_heads = {self.n_heads} is not a multiple of n_kv_heads = "
                f"{self.n_kv_heads}; grouped-query attention needs whole groups")
        if self.head_dim % 2:
            raise ModelConfigError(f"ModelConfig.head_dim = {self.head_dim} must be even (rotary)")
        if self.lora_rank < 0 or self.lora_alpha <= 0:
            raise ModelConfigError(f"ModelConfig.lora_rank = {self.lora_rank} must be >= 0 and "
                                   f"lora_alpha = {self.lora_alpha} > 0")
        problem = lora_targets_error(self.lora_targets)
        if problem and (self.lora_rank or self.lora_targets):  # rank 0 may name none
            raise ModelConfigError(f"ModelConfig.lora_targets: {problem}")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ModelConfigError(
                    f"ModelConfig.{name} = {getattr(self, name)!r}; "
                    f"choose one of {sorted(_DTYPES)}")

    @property
    def jnp_param_dtype(self):
        return _DTYPES[self.param_dtype]

    @property
    def jnp_dtype(self):
        return _DTYPES[self.dtype]

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def without_lora(self) -> ModelConfig:
        """The same shape without LoRA adapters (the LoRA fields at their defaults)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return self.replace(**{name: defaults[name] for name in LORA_FIELDS})

    def projection_dims(self) -> dict[str, tuple[int, int]]:
        """(fan_in, fan_out) of each projection of a layer, its matrix flattened to 2-D."""
        d, f = self.d_model, self.d_ff
        hq, hkv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return {"q": (d, hq), "k": (d, hkv), "v": (d, hkv), "o": (hq, d),
                "gate": (d, f), "up": (d, f), "down": (f, d)}

    def num_params(self, with_value_head: bool = False) -> int:
        """Closed-form parameter count (matches the module's parameters exactly)."""
        d, h, k, hd, f = self.d_model, self.n_heads, self.n_kv_heads, self.head_dim, self.d_ff
        attn = d * h * hd + 2 * d * k * hd + h * hd * d
        if self.attn_bias:
            attn += h * hd + 2 * k * hd
        if self.qk_norm:
            attn += 2 * hd
        layer = attn + 3 * d * f + 2 * d
        if self.lora_rank:
            dims = self.projection_dims()
            layer += self.lora_rank * sum(sum(dims[t]) for t in self.lora_targets)
        total = self.n_layers * layer + self.vocab_size * d + d
        if with_value_head:
            total += d + 1
        elif not self.tie_embeddings:
            total += d * self.vocab_size
        return total


LORA_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name.startswith("lora_"))

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        vocab_size=384, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64,
        d_ff=768, rope_theta=10000.0, tie_embeddings=False, norm_eps=1e-5, max_seq_len=4096),
    "smollm2_135m": ModelConfig(
        vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
        d_ff=1536, rope_theta=100000.0, tie_embeddings=True, norm_eps=1e-5, max_seq_len=8192),
    "qwen3_27b_class": ModelConfig(
        vocab_size=151936, d_model=5120, n_layers=64, n_heads=40, n_kv_heads=8, head_dim=128,
        d_ff=21504, rope_theta=1e6, tie_embeddings=False, norm_eps=1e-6, param_dtype="float32",
        dtype="bfloat16", max_seq_len=32768, qk_norm=True),
}


def get_model_config(name: str, **overrides) -> ModelConfig:
    """Return preset `name` with optional field overrides (ModelConfigError if unknown)."""
    if name not in PRESETS:
        raise ModelConfigError(
            f"unknown model preset {name!r}; choose one of {', '.join(sorted(PRESETS))}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]
