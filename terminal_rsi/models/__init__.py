"""Actor/critic models, tokenizers and weight loaders.

Submodules (imported explicitly; nothing heavy is imported here):
config (ModelConfig, presets), transformer (DecoderLM, ValueModel, KV cache),
tokenizer (ByteTokenizer, HFTokenizer), weights (safetensors / GGUF loaders),
generate (reference greedy decoder).
"""
