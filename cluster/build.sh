#!/usr/bin/env bash
# Builds the local control plane from the official Go modules, through the Go
# module proxy, into a cache outside the checkout (so fresh clones and CI runs on
# the same machine reuse it). A component whose binary is already there for the
# pinned version is not rebuilt.
#
#   cluster/build.sh            build what is missing, print the bin directory
#   cluster/build.sh --print    only print the bin directory
#   cluster/build.sh --kind     also kind and kubeadm, for `make test-kind` (cluster/kindcluster.py)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache="${INFERENTIA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/inferentia-operator}"
bin="$cache/controlplane/bin"
src="$cache/controlplane/src"
[[ "${1:-}" == "--print" ]] && { echo "$bin"; exit 0; }
with_kind=0; [[ "${1:-}" == "--kind" ]] && with_kind=1
mkdir -p "$bin" "$src"

# A toolchain download is impossible offline and a surprise elsewhere: use the Go
# that is installed. Static binaries, no local paths baked in. No debug information compiled:
# every binary is linked without it (-ldflags -w), and compiling it cost about a sixth of
# helm v3's build from an empty build cache (96 s without, 113 s with; 86 and 105 run the other
# way round; 2026-11-26; the whole build not measured both ways). Commands that take no -gcflags ignore it in GOFLAGS.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -gcflags=all=-dwarf=false"
command -v go >/dev/null || { echo "build.sh: Go is required (https://go.dev/dl/)" >&2; exit 1; }

log() { printf '[build] %s\n' "$*" >&2; }

# up_to_date NAME VERSION: the binary exists and was built from VERSION.
up_to_date() { [[ -x "$bin/$1" && "$(cat "$bin/.$1.version" 2>/dev/null)" == "$2" ]]; }
stamp() { echo "$2" > "$bin/.$1.version"; }

# gomod MODULE@VERSION: the path of that module's go.mod, fetched as Go is configured to.
gomod() { go mod download -json "$1" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p'; }

# new_module DIR: an empty main module that only exists to build dependencies.
new_module() {
  rm -rf "$1"; mkdir -p "$1"
  (cd "$1" && go mod init "local.invalid/build/$(basename "$1")" >/dev/null 2>&1 && go mod edit -go=1.26.0)
}

build_kubernetes() {
  local v="$KUBERNETES_VERSION" names=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
  local missing=0 n
  for n in "${names[@]}"; do up_to_date "$n" "$v" || missing=1; done
  (( missing )) || { log "kubernetes $v: cached"; return; }
  log "kubernetes $v: building ${names[*]} (the first build takes a while)"
  local d="$src/kubernetes" staging="v0.${v#v1.}"
  new_module "$d"
  # k8s.io/kubernetes points its staging modules at ./staging with local replaces,
  # which Go ignores in a dependency. Replace each staging module it requires at
  # v0.0.0 with the matching published v0.X.Y instead.
  local mods
  mods=$(gomod "k8s.io/kubernetes@$v")
  local m
  for m in $(sed -n 's/^[[:space:]]*\(k8s\.io\/[a-z0-9-]*\) v0\.0\.0$/\1/p' "$mods"); do
    (cd "$d" && go mod edit -replace "$m=$m@$staging")
  done
  (cd "$d" && go mod edit -require "k8s.io/kubernetes@$v" && go mod download k8s.io/kubernetes >/dev/null \
    && go get "k8s.io/kubernetes@$v" >/dev/null 2>&1 || true)
  local pkg="k8s.io/component-base/version" cpkg="k8s.io/client-go/pkg/version"
  local minor="${v#v1.}"; minor="${minor%%.*}"
  local ld="-s -w"
  for p in "$pkg" "$cpkg"; do
    ld+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  (cd "$d" && go build -mod=mod -ldflags "$ld" -o "$bin/" \
    $(for n in "${names[@]}"; do echo "k8s.io/kubernetes/cmd/$n"; done))
  for n in "${names[@]}"; do stamp "$n" "$v"; done
}

# build_simple NAME MODULE VERSION PACKAGE [LDFLAGS] [STAMP]
build_simple() {
  local name="$1" module="$2" v="$3" pkg="$4" ld="-s -w ${5:-}" stamp_as="${6:-$3}"
  up_to_date "$name" "$stamp_as" && { log "$name $v: cached"; return; }
  log "$name $v: building"
  local d="$src/$name"
  new_module "$d"
  (cd "$d" && go get "$module@$v" >/dev/null 2>&1 || go get "$module@$v")
  (cd "$d" && go build -mod=mod -ldflags "$ld" -o "$bin/$name" "$pkg")
  stamp "$name" "$stamp_as"
}

# Helm's Makefile stamps the Kubernetes version of its client-go into the binary as
# the default for `helm template` and `helm lint` (otherwise v1.20); do the same.
helm_k8s_minor() {
  sed -n 's/^[[:space:]]*k8s\.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$(gomod "helm.sh/helm/v3@$HELM_VERSION")" | head -1
}

# kwok applies its default stages only when it reads no configuration file. The
# control plane passes an explicit one (so a user's ~/.kwok never changes the
# simulation), so it carries the pinned release's own default stages: the same
# set as kustomize/stage/fast (nodes Ready with leases; pods Ready; Job pods done).
kwok_stages() {
  local out="$bin/kwok-stages.yaml" v="$KWOK_VERSION"
  [[ -s "$out" && "$(cat "$bin/.kwok-stages.version" 2>/dev/null)" == "$v" ]] && return
  local dir
  dir=$(cd "$src/kwok" 2>/dev/null && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok) \
    || dir=$(go mod download -json "sigs.k8s.io/kwok@$v" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
  {
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
             pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
      echo "---"
      cat "$dir/kustomize/stage/$f"
    done
  } > "$out"
  stamp kwok-stages "$v"
}

# build_packages NAME MODULE VERSION TAGS PACKAGE...: several commands of one module, in one
# build (they share its compiled packages), each named after its last path element.
build_packages() {
  local name="$1" module="$2" v="$3" tags="$4"; shift 4
  local p missing=0
  for p in "$@"; do up_to_date "$(basename "$p")" "$v" || missing=1; done
  (( missing )) || { log "$name $v: cached"; return; }
  log "$name $v: building $(for p in "$@"; do printf '%s ' "$(basename "$p")"; done)"
  local d="$src/$name"
  new_module "$d"
  (cd "$d" && go get "$module@$v" >/dev/null 2>&1 || go get "$module@$v")
  (cd "$d" && go build -mod=mod -tags "$tags" -ldflags "-s -w" -o "$bin/" "$@")
  for p in "$@"; do stamp "$(basename "$p")" "$v"; done
}

# build_in_module NAME MODULE VERSION TAGS LDFLAGS OUT=PACKAGE...: commands built inside a copy
# of MODULE's own tree, with its go.mod: KEDA's has replace directives, which Go ignores in a
# dependency (so `go install` and `go get` refuse it), and Prometheus's main module is where
# its build tags pick the service discovery it compiles in.
build_in_module() {
  local name="$1" module="$2" v="$3" tags="$4" ld="-s -w $5"; shift 5
  local spec missing=0
  for spec in "$@"; do up_to_date "${spec%%=*}" "$v" || missing=1; done
  (( missing )) || { log "$name $v: cached"; return; }
  log "$name $v: building ${*%%=*} (the first build takes a while)"
  local dir d="$src/$name"
  dir=$(go mod download -json "$module@$v" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
  rm -rf "$d"; cp -r "$dir" "$d"; chmod -R u+w "$d"
  for spec in "$@"; do
    (cd "$d" && GOWORK=off go build -mod=mod -tags "$tags" -ldflags "$ld" -o "$bin/${spec%%=*}" "${spec#*=}")
    stamp "${spec%%=*}" "$v"
  done
}

# KEDA's CRDs, from the same module as its binaries (scaledjobs alone is 667 kB: apply server-side).
keda_crds() {
  local out="$bin/keda-crds" v="$KEDA_VERSION"
  [[ -d "$out" && "$(cat "$bin/.keda-crds.version" 2>/dev/null)" == "$v" ]] && return
  rm -rf "$out"; mkdir -p "$out"
  cp "$src/keda/config/crd/bases/"*.yaml "$out/"
  stamp keda-crds "$v"
}

# LeaderWorkerSet's CRD, from the same module as its controller.
lws_crds() {
  local out="$bin/lws-crds" v="$LWS_VERSION"
  [[ -d "$out" && "$(cat "$bin/.lws-crds.version" 2>/dev/null)" == "$v" ]] && return
  rm -rf "$out"; mkdir -p "$out"
  cp "$src/lws/config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml" "$out/"
  stamp lws-crds "$v"
}

# The Gateway API Inference Extension's CRDs (InferencePool, and the InferenceObjective its
# endpoint picker reads), from its Go module.
inference_extension_crds() {
  local out="$bin/inference-extension-crds" v="$INFERENCE_EXTENSION_VERSION" dir
  [[ -d "$out" && "$(cat "$bin/.inference-extension-crds.version" 2>/dev/null)" == "$v" ]] && return
  dir=$(go mod download -json "sigs.k8s.io/gateway-api-inference-extension@$v" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
  rm -rf "$out"; mkdir -p "$out"
  cp "$dir/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml" \
     "$dir/config/crd/bases/inference.networking.x-k8s.io_inferenceobjectives.yaml" "$out/"
  stamp inference-extension-crds "$v"
}

# build_local NAME DIR REQUIREMENT...: a command of this repository (cluster/node/NAME),
# rebuilt when its source or requirements change.
build_local() {
  local name="$1" dir="$2"; shift 2
  local v
  v="$(cat "$dir"/*.go | sha256sum | cut -c1-16) $*"
  up_to_date "$name" "$v" && { log "$name: cached"; return; }
  log "$name: building"
  local d="$src/$name"
  new_module "$d"
  cp "$dir"/*.go "$d/"
  if (( $# )); then (cd "$d" && go get "$@" >/dev/null 2>&1 || go get "$@"); fi
  (cd "$d" && go mod tidy >/dev/null 2>&1 && go build -mod=mod -ldflags "-s -w" -o "$bin/$name" .)
  stamp "$name" "$v"
}

start=$(date +%s)
build_kubernetes
build_simple etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3
build_simple kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok \
  "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
kwok_stages
minor=$(helm_k8s_minor)
[[ -n "$minor" ]] || { echo "build.sh: cannot read the client-go version from helm $HELM_VERSION's go.mod" >&2; exit 1; }
build_simple helm helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
  "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION $(for p in chartutil lint/rules; do
     printf -- '-X helm.sh/helm/v3/pkg/%s.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/%s.k8sVersionMinor=%s ' "$p" "$p" "$minor"; done)" \
  "$HELM_VERSION+k8s1.$minor"
build_simple helm4 helm.sh/helm/v4 "$HELM4_VERSION" helm.sh/helm/v4/cmd/helm \
  "-X helm.sh/helm/v4/internal/version.version=$HELM4_VERSION"

# The real node: containerd (without the storage drivers this machine lacks) and its runc
# shim; the CNI plugins it wires pods with; the device-plugin stand-in and the sandbox's
# pause process, from cluster/node/. runc itself comes from Debian (cluster/node-deps.sh):
# it must be built with seccomp, which pods' RuntimeDefault profile needs.
build_packages containerd github.com/containerd/containerd/v2 "$CONTAINERD_VERSION" "no_btrfs no_devmapper no_zfs" \
  github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr
mkdir -p "$bin/cni"
( bin="$bin/cni"; build_packages cni-plugins github.com/containernetworking/plugins "$CNI_PLUGINS_VERSION" "" \
  github.com/containernetworking/plugins/plugins/main/bridge github.com/containernetworking/plugins/plugins/ipam/host-local \
  github.com/containernetworking/plugins/plugins/main/loopback github.com/containernetworking/plugins/plugins/meta/portmap )
build_local neuron-device-plugin-standin "$here/node/deviceplugin" "k8s.io/kubelet@v0.${KUBERNETES_VERSION#v1.}" google.golang.org/grpc
# The Neuron DRA driver stand-in, on the kubelet DRA plugin helper of the cluster's release.
build_local neuron-dra-standin "$here/node/draplugin" "k8s.io/dynamic-resource-allocation@v0.${KUBERNETES_VERSION#v1.}" \
  "k8s.io/client-go@v0.${KUBERNETES_VERSION#v1.}" "k8s.io/api@v0.${KUBERNETES_VERSION#v1.}"
build_local pause "$here/node/pause"
# The cluster DNS: CoreDNS with its kubernetes plugin (cluster/node/coredns).
build_local coredns "$here/node/coredns" "github.com/coredns/coredns@$COREDNS_VERSION"
build_in_module keda github.com/kedacore/keda/v2 "$KEDA_VERSION" "" \
  "-X github.com/kedacore/keda/v2/version.Version=$KEDA_VERSION" \
  keda=./cmd/operator keda-adapter=./cmd/adapter
keda_crds
# LeaderWorkerSet: a replica of one leader and N-1 workers, created, placed and restarted as one.
build_in_module lws sigs.k8s.io/lws "$LWS_VERSION" "" "" lws-controller=./cmd
lws_crds
# The Gateway API Inference Extension: its endpoint picker (the ext_proc server a gateway asks)
# and its CRDs.
build_in_module inference-extension sigs.k8s.io/gateway-api-inference-extension "$INFERENCE_EXTENSION_VERSION" "" "" epp=./cmd/epp
inference_extension_crds
# Only Kubernetes service discovery: the serving pods are found through the API server.
build_in_module prometheus github.com/prometheus/prometheus "$PROMETHEUS_VERSION" "remove_all_sd,enable_kubernetes_sd" "" \
  prometheus=./cmd/prometheus
if (( with_kind )); then
  # kind itself, and kubeadm of the control plane's release, which kind's node runs.
  build_simple kind sigs.k8s.io/kind "$KIND_VERSION" sigs.k8s.io/kind
  if ! up_to_date kubeadm "$KUBERNETES_VERSION"; then
    log "kubeadm $KUBERNETES_VERSION: building"
    ld="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      minor="${KUBERNETES_VERSION#v1.}"
      ld+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=1 -X $p.gitMinor=${minor%%.*} -X $p.gitTreeState=clean"
    done
    (cd "$src/kubernetes" && go build -mod=mod -ldflags "$ld" -o "$bin/kubeadm" k8s.io/kubernetes/cmd/kubeadm)
    stamp kubeadm "$KUBERNETES_VERSION"
  fi
fi
log "done in $(( $(date +%s) - start ))s: $(du -sh "$bin" | cut -f1) in $bin"
echo "$bin"
