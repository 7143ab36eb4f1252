#!/usr/bin/env bash
# Stop what .ci/setup_sandbox.sh started: sandbox containers, then the private dockerd.
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKER_DIR=${TRSI_DOCKER_DIR:-/tmp/trsi-docker}
python -c 'from terminal_rsi.sandbox.docker_backend import remove_containers as r; print(r(), "sandbox containers removed")' 2>/dev/null || true
if [[ -f "$DOCKER_DIR/dockerd.pid" ]]; then
  pid=$(cat "$DOCKER_DIR/dockerd.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" || true
  fi
  rm -f "$DOCKER_DIR/dockerd.pid"
  echo "dockerd stopped"
fi
