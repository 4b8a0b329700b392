#!/usr/bin/env bash
# The real node's container runtime built from its Go modules and cached outside the repo, like the Kubernetes
# binaries (devcluster/build_kube_components.sh): containerd 2 (containerd, containerd-shim-runc-v2, ctr) from
# github.com/containerd/containerd/v2 and runc from github.com/opencontainers/runc, into
# $GPULEDGER_CACHE/containerd-v$CONTAINERD_VERSION/bin. devcluster/containerd.py runs them when present
# (kubelet 1.36+ no longer supports Debian's containerd 1.6); Debian's CNI plugins and busybox stay
# (devcluster/runtime.sh).
#
# - containerd: static (CGO_ENABLED=0) with the tags upstream's static release uses, plus no_btrfs (no
#   libbtrfs headers needed), no_devmapper and no_zfs; the shim also with no_grpc, as upstream builds it.
# - runc: needs cgo whatever the tags (libcontainer/nsenter is C). Seccomp needs libseccomp's headers: this
#   script installs Debian's libseccomp-dev when it is missing (as root, or through sudo) and builds with the
#   `seccomp` tag, linked against Debian's libseccomp2; where that cannot be installed it builds without seccomp
#   (a pod's seccomp profile then fails to apply: the tests run Unconfined pods). The `libpathrs` tag of
#   upstream's Makefile is left out (it needs the Rust libpathrs library); runc then uses its Go pathrs-lite.
# Prints the bin folder. Builds run under `nice -n 19`: the machines that run them are shared.
set -euo pipefail
CONTAINERD_VERSION="${CONTAINERD_VERSION:-2.4.2}"
RUNC_VERSION="${RUNC_VERSION:-1.5.3}"
CACHE="${GPULEDGER_CACHE:-$HOME/.cache/gpuledger}"
dest="$CACHE/containerd-v$CONTAINERD_VERSION"
bin="$dest/bin"
want=(containerd containerd-shim-runc-v2 ctr runc)
missing=()
for b in "${want[@]}"; do [ -x "$bin/$b" ] || missing+=("$b"); done
if [ "${#missing[@]}" -eq 0 ]; then echo "$bin"; exit 0; fi
mkdir -p "$bin"
work="$(mktemp -d)"; trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
# the checksum database is not reachable from these machines; the module proxy still serves verified zips
export GOFLAGS=-mod=mod GOTOOLCHAIN=local GOSUMDB="${GOSUMDB:-off}"

# a writable copy of one module's source (the module cache is read-only)
module_src() {
  local dir
  dir="$(cd "$work" && go mod download -json "$1@v$2" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))')"
  cp -r "$dir" "$work/$(basename "$1")"
  chmod -R u+w "$work/$(basename "$1")"
  echo "$work/$(basename "$1")"
}

need() { for m in "${missing[@]}"; do [ "$m" = "$1" ] && return 0; done; return 1; }

if need containerd || need containerd-shim-runc-v2 || need ctr; then
  src="$(module_src github.com/containerd/containerd/v2 "$CONTAINERD_VERSION")"
  pkg=github.com/containerd/containerd/v2
  ldflags="-s -w -X $pkg/version.Version=v$CONTAINERD_VERSION -X $pkg/version.Package=$pkg"
  tags="urfave_cli_no_docs osusergo netgo static_build no_btrfs no_devmapper no_zfs"
  for c in containerd containerd-shim-runc-v2 ctr; do
    need "$c" || continue
    start=$SECONDS
    t="$tags"; [ "$c" = containerd-shim-runc-v2 ] && t="$tags no_grpc"
    (cd "$src" && CGO_ENABLED=0 nice -n 19 go build -trimpath -tags "$t" -ldflags "$ldflags" \
      -o "$bin/$c.tmp" "./cmd/$c") 2>"$work/build.log" || { cat "$work/build.log" >&2; exit 1; }
    mv "$bin/$c.tmp" "$bin/$c"
    echo "built $c v$CONTAINERD_VERSION in $((SECONDS - start))s" >&2
  done
fi

if need runc; then
  tags="urfave_cli_no_docs"
  if ! pkg-config --exists libseccomp 2>/dev/null; then
    sudo_() { if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else return 1; fi; }
    echo "== installing Debian's libseccomp-dev (runc's seccomp support)" >&2
    { sudo_ apt-get update -qq && sudo_ env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends libseccomp-dev >/dev/null; } \
      || echo "libseccomp-dev could not be installed: building runc without seccomp" >&2
  fi
  pkg-config --exists libseccomp 2>/dev/null && tags="seccomp $tags"
  src="$(module_src github.com/opencontainers/runc "$RUNC_VERSION")"
  start=$SECONDS
  (cd "$src" && CGO_ENABLED=1 nice -n 19 go build -trimpath -buildmode=pie -tags "$tags" \
    -ldflags "-s -w -X main.gitCommit=v$RUNC_VERSION" -o "$bin/runc.tmp" .) 2>"$work/build.log" \
    || { cat "$work/build.log" >&2; exit 1; }
  mv "$bin/runc.tmp" "$bin/runc"
  echo "built runc v$RUNC_VERSION ($tags) in $((SECONDS - start))s" >&2
fi
echo "$bin"
