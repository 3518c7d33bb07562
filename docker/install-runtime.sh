#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The image's runtime stage install, shared by docker/Dockerfile and scripts/build-image-stages.sh:
# a fresh venv that gets only the wheel (and its dependencies from the registry), no source tree.
#   docker/install-runtime.sh WHEEL_DIR VENV_DIR      (PYTHON=python3 by default)
set -euo pipefail
wheels="${1:?usage: install-runtime.sh WHEEL_DIR VENV_DIR}"
venv="${2:?usage: install-runtime.sh WHEEL_DIR VENV_DIR}"
python="${PYTHON:-python3}"
shopt -s nullglob
found=("$wheels"/noisyneighbor-*.whl)
if ((${#found[@]} != 1)); then
  echo "install-runtime: expected one noisyneighbor wheel in $wheels, found ${#found[@]}" >&2
  exit 1
fi
"$python" -m venv "$venv"
# LOCK (the image: docker/requirements.lock): every dependency at its locked version, checked against its
# hashes, then the wheel alone. Without it (scripts/build-image-stages.sh on a dev machine) pip resolves.
if [[ -n "${LOCK:-}" ]]; then
  "$venv/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check --require-hashes --no-deps -r "$LOCK"
  "$venv/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check --no-deps "${found[0]}"
else
  "$venv/bin/pip" install --quiet --no-cache-dir --disable-pip-version-check "${found[0]}"
fi
