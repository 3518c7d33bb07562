#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fetch and unpack the VM lane's kernel (scripts/vm/kernel.env) into its cache outside the repository.
# A no-op when the kernel and its modules are already there. Never touches /boot or /lib/modules.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=kernel.env
source "$here/kernel.env"
cache="${NN_VM_CACHE_OVERRIDE:-$NN_VM_CACHE}"
root="$cache/root"
vmlinuz="$root/boot/vmlinuz-$NN_VM_KERNEL_RELEASE"
moddir="$root/lib/modules/$NN_VM_KERNEL_RELEASE"
if [[ -r "$vmlinuz" && -r "$moddir/modules.dep" ]]; then
  exit 0
fi
mkdir -p "$cache"
cd "$cache"
deb=$(ls -t "${NN_VM_KERNEL_PKG}"_*.deb 2>/dev/null | head -1 || true)
if [[ -z "$deb" ]]; then
  echo "vm: downloading $NN_VM_KERNEL_PKG into $cache" >&2
  # apt's sandbox user cannot write a root-owned cache dir; the download itself is unprivileged.
  apt-get download -o APT::Sandbox::User=root "$NN_VM_KERNEL_PKG" >/dev/null
  deb=$(ls -t "${NN_VM_KERNEL_PKG}"_*.deb | head -1)
fi
echo "vm: unpacking $deb into $root" >&2
rm -rf "$root.tmp"
mkdir -p "$root.tmp"
dpkg-deb -x "$deb" "$root.tmp"
# Debian's package leaves modules.dep to its postinst; virtme-ng loads 9p and virtio from it.
depmod -a -b "$root.tmp" "$NN_VM_KERNEL_RELEASE"
rm -rf "$root"
mv "$root.tmp" "$root"
[[ -r "$vmlinuz" ]] || { echo "vm: $deb has no $vmlinuz" >&2; exit 1; }
