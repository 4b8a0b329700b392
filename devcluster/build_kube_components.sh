#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager (and, with COMPONENTS=..., kubelet or kubectl) from the
# k8s.io/kubernetes Go module; cache them outside the repo.
# The staging modules (k8s.io/api, apimachinery, ...) are required at v0.0.0 in kubernetes' go.mod
# and need `replace` directives to the matching v0.MINOR.PATCH tags.
# The controller-manager runs only the workload controllers (job, statefulset, deployment, ...) in the tests;
# it shares nearly every package with the apiserver, so its build mostly hits Go's build cache.
# The kubelet (the real node of tests/e2e/test_real_node.py) is static too (CGO_ENABLED=0), as upstream ships it;
# so is kube-proxy (COMPONENTS=kube-proxy: a Service's virtual IP for the product deployed as pods).
# kube-scheduler (COMPONENTS=kube-scheduler) binds the pods that waited in the ledger's line (devcluster/scheduler.py).
# Builds run under `nice -n 19`: the machines that run them are shared.
set -euo pipefail
K8S_VERSION="${K8S_VERSION:-1.37.2}"
CACHE="${GPULEDGER_CACHE:-$HOME/.cache/gpuledger}"
COMPONENTS="${COMPONENTS:-kube-apiserver kube-controller-manager}"
missing=()
for c in $COMPONENTS; do [ -x "$CACHE/$c-v$K8S_VERSION" ] || missing+=("$c"); done
if [ "${#missing[@]}" -eq 0 ]; then for c in $COMPONENTS; do echo "$CACHE/$c-v$K8S_VERSION"; done; exit 0; fi
mkdir -p "$CACHE"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cd "$work"
# the checksum database is not reachable from these machines; the module proxy still serves verified zips
export GOFLAGS=-mod=mod GOTOOLCHAIN=local GOSUMDB="${GOSUMDB:-off}"
GO=go  # the go binary `nice` runs (a function would not reach it)
go mod init gpuledger.local/apiserverbuild >/dev/null 2>&1
# (the download names the go.mod even when this Go is older than the one it asks for)
gomod="$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])' || true)"
[ -f "$gomod" ] || { echo "k8s.io/kubernetes@v$K8S_VERSION: not served by the module proxy" >&2; exit 1; }
# a release that needs a newer Go than this machine's (1.38 asks for 1.27) is built with the approved
# toolchain, which the go command fetches from the module proxy like a module, verified against the checksum
# database (KUBE_GO_TOOLCHAIN overrides); its go binary then builds with GOTOOLCHAIN=local as before
wants="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod" | head -1)"
have="$(go env GOVERSION | sed 's/^go//')"
if [ -n "$wants" ] && [ "$(printf '%s\n%s\n' "$have" "$wants" | sort -V | tail -1)" != "$have" ]; then
  toolchain="${KUBE_GO_TOOLCHAIN:-go1.27.3}"
  echo "k8s.io/kubernetes v$K8S_VERSION needs Go $wants: building with $toolchain" >&2
  GOSUMDB=sum.golang.org GOTOOLCHAIN="$toolchain" go version >&2
  gobin="$(go env GOMODCACHE)/golang.org/toolchain@v0.0.1-$toolchain.$(go env GOOS)-$(go env GOARCH)/bin/go"
  go() { "$gobin" "$@"; }
  GO="$gobin"
fi
staging_minor="0.${K8S_VERSION#1.}"
# every k8s.io module that kubernetes requires at v0.0.0 is a staging module
python3 - "$gomod" "$staging_minor" >> go.mod <<'PY'
import re, sys
text = open(sys.argv[1]).read()
mods = sorted(set(re.findall(r"^\s*(k8s\.io/[\w.\-/]+)\s+v0\.0\.0\s*$", text, re.M)))
print("replace (")
for m in mods:
    print(f"\t{m} => {m} v{sys.argv[2]}")
print(")")
PY
echo "require k8s.io/kubernetes v$K8S_VERSION" >> go.mod
go mod download k8s.io/kubernetes >/dev/null
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
for c in "${missing[@]}"; do
  out="$CACHE/$c-v$K8S_VERSION"
  start=$SECONDS
  CGO_ENABLED=0 nice -n 19 "$GO" build -trimpath -ldflags "$ldflags" -o "$out.tmp" "k8s.io/kubernetes/cmd/$c" 2>build.log \
    || { cat build.log >&2; exit 1; }
  mv "$out.tmp" "$out"
  echo "built $c in $((SECONDS - start))s" >&2
done
for c in $COMPONENTS; do echo "$CACHE/$c-v$K8S_VERSION"; done
