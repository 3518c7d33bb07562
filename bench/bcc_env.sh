#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Make bcc's runtime-compiled tools (runqlat-bpfcc) work on this machine, for bench/overhead.py.
#
# bcc compiles its BPF C at run time with clang and needs kernel headers under
# /lib/modules/$(uname -r)/build. Our kernel ships none of its own (no /lib/modules, no
# CONFIG_IKHEADERS), but the tracepoint-only tools compile against Debian's generic headers
# (linux-headers-amd64), as they only use stable structs and raw tracepoints. So:
#   1. install bpfcc-tools and linux-headers-amd64 if missing (apt-get update once first);
#   2. point /lib/modules/$(uname -r)/build at the newest Debian amd64 headers tree and .../source
#      at its -common tree (Debian's own layout), but only where nothing exists yet: never
#      overwrite or replace anything.
# Idempotent: a second run changes nothing and says so. Needs root for steps it has to take.
#   bench/bcc_env.sh            set up (prints what it did)
#   bench/bcc_env.sh --check    only report; exit 1 if something is missing
set -euo pipefail

check_only=0
[[ "${1:-}" == --check ]] && check_only=1
say() { echo "bcc_env: $*" >&2; }

kver="$(uname -r)"
moddir="/lib/modules/$kver"
pkgs=(bpfcc-tools linux-headers-amd64)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  if ((check_only)); then
    say "missing packages: ${missing[*]}"
    exit 1
  fi
  if [[ $(id -u) -ne 0 ]]; then
    say "missing packages ${missing[*]} and not root: install them or run as root"
    exit 1
  fi
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  say "installed ${missing[*]}"
else
  say "packages present: ${pkgs[*]}"
fi

# The newest Debian amd64 headers tree (linux-headers-amd64 depends on linux-headers-<ver>-amd64,
# which depends on linux-headers-<ver>-common and carries a 'source' link to it).
hdr=""
while IFS= read -r d; do hdr="$d"; done < <(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V)
if [[ -z "$hdr" ]]; then
  say "no /usr/src/linux-headers-*-amd64 tree found (is linux-headers-amd64 installed?)"
  exit 1
fi

# Mirror Debian's own layout for that tree (/lib/modules/<ver>-amd64/{build,source}):
# build -> the arch tree, source -> the matching -common tree.
debver="$(basename "$hdr")"; debver="${debver#linux-headers-}"
src="/usr/src/linux-headers-${debver%-amd64}-common"
[[ -L "/lib/modules/$debver/source" ]] && src="$(readlink -f "/lib/modules/$debver/source")"
[[ -d "$src" ]] || src="$hdr"

link() {  # link NAME TARGET: create $moddir/NAME -> TARGET unless something (even a dangling link) is there
  local path="$moddir/$1" target="$2"
  if [[ -e "$path" || -L "$path" ]]; then
    say "$path exists ($( [[ -L "$path" ]] && echo "-> $(readlink "$path")" || echo "not a link" )): left as is"
    [[ -d "$path" ]] || { say "warning: $path does not resolve to a directory"; return 1; }
    return 0
  fi
  if ((check_only)); then
    say "$path missing"
    return 1
  fi
  mkdir -p "$moddir"
  ln -s "$target" "$path"
  say "created $path -> $target"
}

rc=0
link build "$hdr" || rc=1
link source "$src" || rc=1

if ((rc == 0)); then
  say "ready: bcc will compile against $(readlink -f "$moddir/build") (kernel $kver)"
fi
exit $rc
