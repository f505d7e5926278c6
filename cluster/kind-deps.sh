#!/usr/bin/env bash
# What `make test-kind` needs beyond `make test`: a container engine for kind's node. A Docker
# engine that answers is used as it is; otherwise Debian's podman is installed (as root), which
# kind drives with KIND_EXPERIMENTAL_PROVIDER=podman (cluster/kindcluster.py), and the network
# backend INFERENTIA_KIND_NETWORK_BACKEND names (cni or netavark; unset, podman's own choice)
# gets its packages: Debian's podman depends on the CNI plugins alone, and netavark comes with
# aardvark-dns, which it runs for a network's DNS.
set -euo pipefail
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then exit 0; fi
packages=()
command -v podman >/dev/null || packages+=(podman)
# Read as kindcluster.network_backend reads it: spaces dropped, any case.
backend=$(printf %s "${INFERENTIA_KIND_NETWORK_BACKEND:-}" | tr -d '[:space:]' | tr '[:upper:]' '[:lower:]')
case "$backend" in
  netavark) [[ -x /usr/lib/podman/netavark || -x /usr/libexec/podman/netavark ]] || packages+=(netavark aardvark-dns) ;;
  cni) [[ -x /usr/lib/cni/bridge || -x /opt/cni/bin/bridge ]] || packages+=(containernetworking-plugins) ;;
  "") ;;
  *) echo "[kind-deps] INFERENTIA_KIND_NETWORK_BACKEND=$INFERENTIA_KIND_NETWORK_BACKEND: cni or netavark" >&2; exit 1 ;;
esac
(( ${#packages[@]} )) || exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "[kind-deps] not root to install ${packages[*]}" >&2
  exit 1
fi
echo "[kind-deps] apt-get install ${packages[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
