#!/usr/bin/env bash
# Build the helm CLI from its Go module (helm.sh/helm/v3) and cache it outside the repo, as
# devcluster/build_kube_components.sh does for kube-apiserver. Only tests/deploy/test_helm.py and `make helm`
# need it; the build runs under `nice -n 19` because the machines that run it are shared. Prints the path.
set -euo pipefail
HELM_VERSION="${HELM_VERSION:-3.22.0}"
CACHE="${GPULEDGER_CACHE:-$HOME/.cache/gpuledger}"
out="$CACHE/helm-v$HELM_VERSION"
if [ -x "$out" ]; then echo "$out"; exit 0; fi
mkdir -p "$CACHE"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cd "$work"
# the checksum database is not reachable from these machines; the module proxy still serves verified zips
export GOFLAGS=-mod=mod GOSUMDB="${GOSUMDB:-off}"
go mod init gpuledger.local/helmbuild >/dev/null 2>&1
echo "require helm.sh/helm/v3 v$HELM_VERSION" >> go.mod
go mod download helm.sh/helm/v3 >/dev/null
start=$SECONDS
CGO_ENABLED=0 nice -n 19 go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION" \
  -o "$out.tmp" helm.sh/helm/v3/cmd/helm 2>build.log || { cat build.log >&2; exit 1; }
mv "$out.tmp" "$out"
echo "built helm v$HELM_VERSION in $((SECONDS - start))s" >&2
echo "$out"
