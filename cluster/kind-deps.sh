#!/usr/bin/env bash
# What `make test-kind` needs beyond `make test`: a container engine for kind's node. A Docker
# engine that answers is used as it is; otherwise Debian's podman is installed (as root), which
# kind drives with KIND_EXPERIMENTAL_PROVIDER=podman (cluster/kindcluster.py).
set -euo pipefail
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then exit 0; fi
command -v podman >/dev/null && exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "[kind-deps] no Docker engine and no podman, and not root to install podman" >&2
  exit 1
fi
echo "[kind-deps] apt-get install podman" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends podman >/dev/null
