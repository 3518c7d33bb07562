#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs inside the VM (scripts/vm/run.py starts it as the guest's command): prepares the cgroup v2
# hierarchy the way a systemd/kubelet node has it, runs the command written by the host into
# OUTDIR/cmd from the project root, and leaves its output and exit status in OUTDIR for the host.
#   guest.sh OUTDIR PROJECT
set -uo pipefail
out="$1"
project="$2"
exec >"$out/output" 2>&1
cd "$project" || { echo "vm: no project dir $project in the guest"; echo 125 >"$out/rc"; exit 125; }

export PATH="$project/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
export HOME=/root NN_VM=1 PYTHONUNBUFFERED=1
ulimit -l unlimited 2>/dev/null || true

cg=/sys/fs/cgroup
if ! grep -q "^cgroup2 $cg " /proc/mounts; then
  echo "vm: $cg is not a cgroup2 mount in the guest"
  echo 125 >"$out/rc"
  exit 125
fi
# A systemd node (and the kubelet, which needs cpuset cpu io memory hugetlb pids) has every
# controller enabled in the root's subtree_control. The command stays in the root cgroup: the root
# is the one cgroup v2 lets hold tasks while its children have controllers ("no internal
# processes"), so the tests' own nn-test-<pid> directory below it can enable them for its pods.
for c in $(cat "$cg/cgroup.controllers"); do
  echo "+$c" >"$cg/cgroup.subtree_control" || echo "vm: cannot enable $c in $cg/cgroup.subtree_control"
done
# The kernel's modules live in the lane's cache, shared into the guest read-only by run.py (the
# guest's own /var/cache hides it: modprobe said "Module virtio_blk not found in directory
# /lib/modules/<release>"). The modules the tests and the scratch disk need are loaded here, by path,
# dependencies first (modules.dep), so a kernel module request that goes wrong cannot fail a test.
kver="$(uname -r)"
moddir="$(cat "$out/modroot" 2>/dev/null || true)/lib/modules/$kver"
load_module() {
  local line deps dep
  line="$(grep -m1 "/$1.ko[.a-z]*:" "$moddir/modules.dep" 2>/dev/null)" || {
    grep -qw "$1" "$moddir/modules.builtin" 2>/dev/null || echo "vm: no module $1 in $moddir"
    return 0
  }
  deps="${line#*:}"
  for dep in $(echo $deps | tr ' ' '\n' | tac) "${line%%:*}"; do
    grep -q "^$(basename "${dep%%.ko*}" | tr - _) " /proc/modules || insmod "$moddir/$dep" 2>/dev/null \
      || grep -q "^$(basename "${dep%%.ko*}" | tr - _) " /proc/modules || echo "vm: insmod $dep failed"
  done
}
# veth: the tests' network namespace pairs (ip link add ... type veth).
load_module veth
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || true
ip link set lo up 2>/dev/null || true
# SysRq from qemu's monitor (run.py's stall dump: l, every CPU's backtrace; w, the blocked tasks): Debian's
# default (438) leaves out the dumps.
echo 1 >/proc/sys/kernel/sysrq 2>/dev/null || echo "vm: cannot enable SysRq: no backtraces in a stall dump"

# An optional scratch disk (run.py --disk SIZE): a real filesystem whose page cache is charged to
# the reader's memory cgroup, unlike the 9p root and tmpfs (docs: platforms.md).
if [[ -s "$out/disk" ]]; then
  dev=""
  # vng --disk attaches it over virtio-blk (/dev/vda); the root is 9p, so it is the only disk.
  load_module virtio_blk
  load_module crc32c_generic  # ext4's metadata checksums: the crypto API cannot autoload it here
  load_module ext4
  for _ in $(seq 50); do
    # No udev in the guest: make the node from sysfs if devtmpfs has not.
    for b in /sys/block/vd[a-z] /sys/block/sd[a-z]; do
      [[ -e "$b/dev" && ! -b "/dev/${b##*/}" ]] && mknod "/dev/${b##*/}" b $(tr ':' ' ' <"$b/dev")
    done
    for d in /dev/vd[a-z] /dev/sd[a-z]; do [[ -b "$d" ]] && dev="$d" && break; done
    [[ -n "$dev" ]] && break
    sleep 0.2
  done
  if [[ -n "$dev" ]] && mkfs.ext4 -q -F "$dev" && mkdir -p /tmp/nn-disk && mount "$dev" /tmp/nn-disk; then
    export NN_VM_DISK=/tmp/nn-disk
  else
    echo "vm: scratch disk requested but not mounted (device: ${dev:-none}; block devices: $(ls /sys/block | tr '\n' ' '))"
  fi
fi

echo "vm: $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {print int($2/1024) " MiB"}' /proc/meminfo)," \
  "cgroup2 subtree_control: $(cat "$cg/cgroup.subtree_control")"
bash "$out/cmd"
rc=$?
sync
echo "$rc" >"$out/rc"
exit "$rc"
