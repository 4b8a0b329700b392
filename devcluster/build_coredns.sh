#!/usr/bin/env bash
# Build CoreDNS (the cluster DNS of devcluster/services.py) from its Go module, cached outside the repo like
# the Kubernetes components (devcluster/build_kube_components.sh). Runs under `nice -n 19`: the machines that
# run it are shared.
set -euo pipefail
COREDNS_VERSION="${COREDNS_VERSION:-1.12.1}"
CACHE="${GPULEDGER_CACHE:-$HOME/.cache/gpuledger}"
out="$CACHE/coredns-v$COREDNS_VERSION"
if [ -x "$out" ]; then echo "$out"; exit 0; fi
mkdir -p "$CACHE"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
# the checksum database is not reachable from these machines; the module proxy still serves verified zips
export GOTOOLCHAIN=local GOSUMDB="${GOSUMDB:-off}" GOBIN="$work" CGO_ENABLED=0
start=$SECONDS
nice -n 19 go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@v$COREDNS_VERSION" 2>"$work/build.log" \
  || { cat "$work/build.log" >&2; exit 1; }
mv "$work/coredns" "$out"
echo "built coredns in $((SECONDS - start))s" >&2
echo "$out"
