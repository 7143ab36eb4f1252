"""Actor/critic models, tokenizers and weight loaders.

Submodules (imported explicitly; nothing heavy is imported here):
config (ModelConfig, presets), transformer (DecoderLM, ValueModel, KV cache),
tokenizer (ByteTokenizer, HFTokenizer), bpe (BPETokenizer: the tiny model's shipped BPE
vocabulary), weights (safetensors / GGUF loaders),
generate (reference greedy decoder), sampling (the compiled KV-cache sampler), logprobs
(chunked token log-probs), trainable (the trainable/frozen split of a model's state).
"""
