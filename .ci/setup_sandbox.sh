#!/usr/bin/env bash
# CI setup for terminal_rsi.sandbox (idempotent): Debian packages, Python extras, a private
# Docker daemon (no bridge, no iptables, state under /tmp), and the default sandbox image
# built offline from debootstrap + local wheels. Undo with .ci/teardown_sandbox.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
DOCKER_DIR=${TRSI_DOCKER_DIR:-/tmp/trsi-docker}

echo "== sandbox: Debian packages (docker.io bubblewrap debootstrap tmux)"
need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if ((${#need[@]})); then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

echo "== sandbox: Python extras"
python -m pip install -q 'starlette>=0.37,<1' 'uvicorn>=0.30,<1' 'httpx>=0.27,<1' 'docker>=7.1,<8'

engine_up() { python -c 'import docker; docker.from_env(timeout=5).ping()' >/dev/null 2>&1; }

echo "== sandbox: Docker daemon"
if ! engine_up; then
  mkdir -p "$DOCKER_DIR"
  nohup dockerd --bridge=none --iptables=false --ip6tables=false \
    --data-root="$DOCKER_DIR/data" --exec-root="$DOCKER_DIR/exec" \
    --pidfile="$DOCKER_DIR/dockerd.pid" -H unix:///var/run/docker.sock \
    >"$DOCKER_DIR/dockerd.log" 2>&1 &
  for _ in $(seq 1 60); do engine_up && break; sleep 1; done
  engine_up || { tail -50 "$DOCKER_DIR/dockerd.log"; echo "dockerd did not start" >&2; exit 1; }
fi

echo "== sandbox: image (cached; first build runs debootstrap, ~2-3 min)"
time python -m terminal_rsi.sandbox.image build
