#!/usr/bin/env bash
# The Debian packages the real node (cluster/realnode.py) needs, installed when missing:
# runc (Debian's is built with seccomp, which pods' RuntimeDefault profile needs), iptables
# for kube-proxy, conntrack, mmdebstrap for the images' Debian base, and Debian's CPU-only
# PyTorch, with which the real-model tests compute the answers they expect. Only as root, since
# only root can run the real node; otherwise it says so and does nothing.
set -euo pipefail
[[ "${INFERENTIA_REAL_NODE:-1}" == "0" ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
  echo "[node-deps] not root: the real node will not run (the suite says so), nothing installed" >&2
  exit 0
fi
need=()
for pair in runc:/usr/sbin/runc iptables:/usr/sbin/iptables conntrack:/usr/sbin/conntrack mmdebstrap:/usr/bin/mmdebstrap \
    python3-torch:/usr/lib/python3/dist-packages/torch/__init__.py; do
  [[ -e "${pair#*:}" ]] || need+=("${pair%%:*}")
done
(( ${#need[@]} )) || exit 0
echo "[node-deps] apt-get install ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
