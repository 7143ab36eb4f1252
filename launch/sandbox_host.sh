#!/usr/bin/env bash
# Start a sandbox host: Debian packages, a private dockerd, the sandbox image, then the HTTP
# bridge. Trainers connect with SandboxPool(["http://<host>:8765", ...], token_file=...).
# Env: BACKEND (docker|local), HOST, PORT, TOKEN_FILE, MAX_SANDBOXES, WARM, TTL.
set -euo pipefail
cd "$(dirname "$0")/.."
TOKEN_FILE=${TOKEN_FILE:-$HOME/.config/terminal_rsi/sandbox_tokens}
if [[ ! -f "$TOKEN_FILE" ]]; then
  mkdir -p "$(dirname "$TOKEN_FILE")"
  (umask 077; python -c 'import secrets; print("trainer:" + secrets.token_hex(24))' >"$TOKEN_FILE")
  echo "wrote a new token to $TOKEN_FILE; copy it to the trainers"
fi
bash .ci/setup_sandbox.sh
exec python -m terminal_rsi.sandbox.serve --backend="${BACKEND:-docker}" \
  --host="${HOST:-0.0.0.0}" --port="${PORT:-8765}" --token-file="$TOKEN_FILE" \
  --max-sandboxes="${MAX_SANDBOXES:-64}" --warm="${WARM:-8}" --ttl="${TTL:-900}" \
  --base-dir=/tmp/trsi-sandboxes --log-level=info
