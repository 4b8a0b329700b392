#!/usr/bin/env bash
# The real node's container runtime from Debian's packages: containerd (+ ctr and the runc v2 shim) and runc
# where the cached containerd 2 build is missing, the CNI plugins (bridge, host-local, loopback) and a static busybox that devcluster/images.py turns into images.
# Installs only what is missing; starts nothing (devcluster/kubelet.py runs its own containerd per node).
set -euo pipefail
need=()
# containerd 2 and runc built from their Go modules (devcluster/build_runtime.sh, `make runtime` runs it first)
# replace Debian's containerd 1.6 and runc, which are then not installed
cached="${GPULEDGER_CACHE:-$HOME/.cache/gpuledger}/containerd-v${CONTAINERD_VERSION:-2.4.2}/bin"
if ! { [ -x "$cached/containerd" ] && [ -x "$cached/containerd-shim-runc-v2" ] && [ -x "$cached/ctr" ] \
    && [ -x "$cached/runc" ]; }; then
  command -v containerd >/dev/null && command -v containerd-shim-runc-v2 >/dev/null && command -v ctr >/dev/null \
    || need+=(containerd)
  command -v runc >/dev/null || need+=(runc)
fi
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] \
  || need+=(containernetworking-plugins)
# the static build: an image holds no libc for a dynamically linked busybox to load
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "ok installed" || need+=(busybox-static)
# a Service's virtual IP for the tests that deploy the product as pods (kube-proxy's iptables mode, the
# rule that takes pods to kube-apiserver: devcluster/services.py)
command -v iptables >/dev/null || need+=(iptables)
# builds the product image's Debian root filesystem (devcluster/product_image.py)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
if [ "${#need[@]}" -eq 0 ]; then exit 0; fi
echo "== installing the real node's runtime from Debian: ${need[*]}" >&2
sudo_() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
sudo_ apt-get update -qq
# policy-rc.d or no systemd: the package's own containerd service is not started (and not needed)
sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
