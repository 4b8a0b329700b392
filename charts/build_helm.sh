#!/usr/bin/env bash
# Build the helm CLI from its Go module (helm.sh/helm/v3) and cache it outside the repo, as
# devcluster/build_kube_components.sh does for kube-apiserver. Only tests/deploy/test_helm.py and `make helm`
# need it; the build runs under `nice -n 19` because the machines that run it are shared. Prints the path.
set -euo pipefail
HELM_VERSION="${HELM_VERSION:-3.22.0}"
CACHE="${GPULEDGER_CACHE:-$HOME/.cache/gpuledger}"
# "-release": built with the ldflags of helm's own release build (below), unlike an older cache entry
out="$CACHE/helm-v$HELM_VERSION-release"
if [ -x "$out" ]; then echo "$out"; exit 0; fi
mkdir -p "$CACHE"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
cd "$work"
# the checksum database is not reachable from these machines; the module proxy still serves verified zips
export GOFLAGS=-mod=mod GOSUMDB="${GOSUMDB:-off}"
go mod init gpuledger.local/helmbuild >/dev/null 2>&1
echo "require helm.sh/helm/v3 v$HELM_VERSION" >> go.mod
go mod download helm.sh/helm/v3 >/dev/null
# as helm's Makefile does: the Kubernetes version `helm template` assumes is the client-go minor it is built
# with (1.37 for helm 3.22), not v1.20.0, so a chart's kubeVersion (>=1.35) renders without --kube-version
kube="$(cd "$(go list -m -f '{{.Dir}}' helm.sh/helm/v3)" && go list -m -f '{{.Version}}' k8s.io/client-go)"
kube_minor="$(echo "$kube" | cut -d. -f2)"
kube_flags="-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$kube_minor"
kube_flags="$kube_flags -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$kube_minor"
start=$SECONDS
CGO_ENABLED=0 nice -n 19 go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION $kube_flags" \
  -o "$out.tmp" helm.sh/helm/v3/cmd/helm 2>build.log || { cat build.log >&2; exit 1; }
mv "$out.tmp" "$out"
echo "built helm v$HELM_VERSION in $((SECONDS - start))s" >&2
echo "$out"
