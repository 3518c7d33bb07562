#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Point apt at snapshot.debian.org for one date, so a rebuild gets the same Debian packages (the image's
# package versions are pinned too: a version that date does not serve fails the install instead of drifting).
# Only for the image build (docker/Dockerfile): it rewrites the container's apt sources.
#   docker/apt-snapshot.sh 20261120T000000Z
set -euo pipefail
date="${1:?usage: apt-snapshot.sh YYYYMMDDTHHMMSSZ}"
[[ "$date" =~ ^[0-9]{8}T[0-9]{6}Z$ ]] || { echo "apt-snapshot: bad date $date" >&2; exit 2; }
[[ -f /.dockerenv || -n "${NN_IMAGE_BUILD:-}" || "$(cat /proc/1/comm 2>/dev/null)" != systemd ]] || {
  echo "apt-snapshot: refuses to rewrite the apt sources of a host running systemd" >&2; exit 2; }
rm -f /etc/apt/sources.list.d/debian.sources
{
  echo "deb http://snapshot.debian.org/archive/debian/$date bookworm main"
  echo "deb http://snapshot.debian.org/archive/debian/$date bookworm-updates main"
  echo "deb http://snapshot.debian.org/archive/debian-security/$date bookworm-security main"
} > /etc/apt/sources.list
# A snapshot's Release files are past their Valid-Until by design.
apt-get -o Acquire::Check-Valid-Until=false update -qq
