#!/usr/bin/env bash
# CI setup for terminal_rsi.sandbox (idempotent): Debian packages, Python extras, a private
# Docker daemon (no bridge, no iptables, state under /tmp), and the default sandbox image
# built offline from debootstrap + local wheels. Undo with .ci/teardown_sandbox.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
DOCKER_DIR=${TRSI_DOCKER_DIR:-/tmp/trsi-docker}

echo "== sandbox: Debian packages (bubblewrap slirp4netns debootstrap tmux)"
need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
# user-mode networking for local-bwrap's network=True (never the host's network namespace)
command -v slirp4netns >/dev/null 2>&1 || need+=(slirp4netns)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if ((${#need[@]})); then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Real task Dockerfiles need the engine's BuildKit with the Dockerfile 1.4+ syntax (heredoc
# RUN, COPY --link, ...) and `docker compose` v2: Docker >= 23. Debian 12's docker.io is
# 20.10, so the engine, its CLI, buildx and compose come from Debian 13 (trixie), pinned so
# that nothing else is taken from it (they need nothing newer than Debian 12's libraries).
echo "== sandbox: Docker engine >= 23 with buildx and compose (Debian 13 packages)"
engine_major() { dockerd --version 2>/dev/null | sed -E 's/^Docker version ([0-9]+).*/\1/'; }
if [[ "$(engine_major)" -lt 23 ]] 2>/dev/null || ! command -v dockerd >/dev/null 2>&1 \
    || ! docker buildx version >/dev/null 2>&1 || ! docker compose version >/dev/null 2>&1; then
  . /etc/os-release
  if [[ "${VERSION_CODENAME:-}" == bookworm ]]; then
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
      > /etc/apt/sources.list.d/trsi-trixie-docker.list
    printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' \
      > /etc/apt/preferences.d/trsi-trixie-docker
    from=/trixie  # these four from Debian 13; their dependencies resolve from Debian 12
  else
    from=
  fi
  if pid=$(cat "$DOCKER_DIR/dockerd.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"; for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends \
    "docker.io$from" "docker-cli$from" "docker-buildx$from" "docker-compose$from" >/dev/null
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

# The base of the real-format task fixtures (tests/tasks/fixtures/real): the same Debian rootfs
# as root with no WORKDIR, standing in for python:3.x-slim-bookworm (nothing can be pulled).
echo "== sandbox: task base image (trsi-task-base:bookworm, from the same rootfs)"
python -m terminal_rsi.sandbox.image build-task-base
