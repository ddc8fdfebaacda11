#!/usr/bin/env bash
# Build (or reuse) the local control-plane binaries from Go modules.
#
# Why: CI machines have no Docker engine, so the e2e suite runs a real
# kube-apiserver + etcd (+ controller-manager, scheduler, kube-proxy, kubectl,
# helm) built from the pinned wrapper modules in hack/bins/.
# Binaries land in a versioned cache directory outside the checkout and are
# reused when present, so a warm run takes seconds.
#
# Usage: hack/control-plane.sh            # prints the bin directory on stdout
# Env:   KUBEBUILDER_ASSETS  use this directory as is (envtest convention)
#        GENRM_CACHE         cache root (default ~/.cache/genrm-operator)
set -euo pipefail

K8S_VERSION=1.36.3
ETCD_VERSION=3.6.16
HELM_VERSION=3.21.4

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log() { printf '[control-plane] %s\n' "$*" >&2; }

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  # The local cluster runs all of these (envtest's assets alone lack the controllers and kube-proxy).
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl; do
    [[ -x "$KUBEBUILDER_ASSETS/$b" ]] || { log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS lacks $b"; exit 1; }
  done
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

CACHE="${GENRM_CACHE:-$HOME/.cache/genrm-operator}"
OUT="$CACHE/bin/k8s-v$K8S_VERSION-etcd-v$ETCD_VERSION-helm-v$HELM_VERSION"
mkdir -p "$OUT"
# Two runs at once (make's targets, or several checkouts on one machine) would build the same binary
# into the same temporary name; the second waits here and then reuses what the first built.
exec 9>"$OUT/.build.lock"
flock 9
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-trimpath -mod=readonly"
JOBS="${GENRM_BUILD_JOBS:-$(nproc)}"

build() { # name module-dir package [ldflags]
  local name=$1 dir=$2 pkg=$3 ldflags=${4:-}
  if [[ -x "$OUT/$name" ]]; then log "reuse $name"; return; fi
  log "building $name from $pkg (cold builds take minutes; progress below)"
  local start=$SECONDS
  ( cd "$HERE/bins/$dir" && go build -p "$JOBS" -ldflags "-s -w $ldflags" -o "$OUT/$name.tmp" "$pkg" ) &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 30
    kill -0 "$pid" 2>/dev/null && log "  still building $name ($((SECONDS - start))s)"
  done
  wait "$pid"
  mv "$OUT/$name.tmp" "$OUT/$name"
  log "built $name in $((SECONDS - start))s"
}

MINOR=${K8S_VERSION#*.}; MINOR=${MINOR%%.*}
V=k8s.io/component-base/version; C=k8s.io/client-go/pkg/version
K8S_LDF="-X $V.gitMajor=1 -X $V.gitMinor=$MINOR -X $V.gitVersion=v$K8S_VERSION -X $V.gitTreeState=clean \
 -X $C.gitMajor=1 -X $C.gitMinor=$MINOR -X $C.gitVersion=v$K8S_VERSION -X $C.gitTreeState=clean"

build etcd etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s k8s.io/kubernetes/cmd/kube-apiserver "$K8S_LDF"
build kube-controller-manager k8s k8s.io/kubernetes/cmd/kube-controller-manager "$K8S_LDF"
build kube-scheduler k8s k8s.io/kubernetes/cmd/kube-scheduler "$K8S_LDF"
build kube-proxy k8s k8s.io/kubernetes/cmd/kube-proxy "$K8S_LDF"
build kubectl k8s k8s.io/kubernetes/cmd/kubectl "$K8S_LDF"
build helm helm helm.sh/helm/v3/cmd/helm "-X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION"
echo "$OUT"
