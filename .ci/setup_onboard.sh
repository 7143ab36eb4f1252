#!/usr/bin/env bash
# CI setup for tests/launch, tests/notebooks and tests/docs: curl (the sandbox-host health
# check is run for real against a loopback bridge) and the notebook runner's Python packages
# (also in setup.py's `notebooks` and `dev` extras). Idempotent.
set -euo pipefail
if ! command -v curl >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq curl
fi
python3 -c "import nbclient, nbformat, ipykernel" 2>/dev/null || \
  python3 -m pip install -q "nbclient>=0.10,<1" "nbformat>=5.9,<6" "ipykernel>=6.29,<8"
