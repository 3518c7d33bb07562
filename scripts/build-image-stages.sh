#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run docker/Dockerfile's stages on this machine, without a container engine:
#   1. a clean copy of the tree (the files git tracks or would track, as a build context holds them);
#   2. the build stage: docker/build-stage.sh (make bpf + the wheel) into a dist dir;
#   3. the runtime stage: docker/install-runtime.sh (a fresh venv with only the wheel), then
#      docker/check-runtime.sh (BPF objects inside the installed package, `noisyneighbor --help`,
#      imports, libbpf.so.1, all with a PATH that has no clang).
# Before that it reads the Dockerfile: its RUN lines must call those same scripts, its apt packages must
# be installed here, and its Python must be this Python's major.minor; otherwise this run would not
# stand for the image.
#   scripts/build-image-stages.sh [--keep DIR]   (--keep: work in DIR and leave it for inspection)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dockerfile="${DOCKERFILE:-$repo/docker/Dockerfile}"  # overridable so tests can feed it a broken one
python="${PYTHON:-python3}"

work=""
keep=0
while (($#)); do
  case "$1" in
    --keep) work="${2:?--keep needs a directory}"; keep=1; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "build-image-stages: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -z "$work" ]]; then
  work="$(mktemp -d -t nn-image-stages.XXXXXX)"
else
  mkdir -p "$work"
  work="$(cd "$work" && pwd)"
  if [[ -n "$(ls -A "$work")" ]]; then
    echo "build-image-stages: $work is not empty" >&2
    exit 2
  fi
fi
if ((!keep)); then
  trap 'rm -rf "$work"' EXIT
fi
step() { echo "build-image-stages: $*" >&2; }

# ---- the Dockerfile, as this run's specification ------------------------------------------------
[[ -r "$dockerfile" ]] || { echo "build-image-stages: no $dockerfile" >&2; exit 1; }
# Join continuation lines so each instruction is one line, then split the file into stages.
instructions="$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$dockerfile" | grep -v '^[[:space:]]*#' || true)"
stage_of() {  # print the instructions of the stage named $1
  awk -v want="$1" 'toupper($1) == "FROM" { stage = tolower($NF) } stage == want' <<<"$instructions"
}
build_stage="$(stage_of build)"
runtime_stage="$(stage_of runtime)"
[[ -n "$build_stage" && -n "$runtime_stage" ]] || {
  echo "build-image-stages: the Dockerfile needs stages named 'build' and 'runtime'" >&2; exit 1; }
require_run() {  # stage text, stage name, script name
  grep -Eq "^RUN .*docker/$3|^RUN .*/$3" <<<"$1" || {
    echo "build-image-stages: the Dockerfile's $2 stage does not RUN $3: this script would not match it" >&2
    exit 1
  }
}
require_run "$build_stage" build build-stage.sh
require_run "$runtime_stage" runtime install-runtime.sh
require_run "$runtime_stage" runtime check-runtime.sh
apt_packages() {  # the packages of the stage's `apt-get install` lines
  grep -o 'apt-get install[^&;]*' <<<"$1" | tr ' ' '\n' | grep -Ev '^(apt-get|install|-.*|)$' | sed 's/=.*//' | sort -u
}
missing=()
for pkg in $(apt_packages "$build_stage") $(apt_packages "$runtime_stage"); do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "build-image-stages: the Dockerfile installs ${missing[*]}, not installed here (scripts/setup.sh)" >&2
  exit 1
fi
image_py="$(grep -Eo '^ARG PYTHON_IMAGE=python:[0-9]+\.[0-9]+' "$dockerfile" | grep -Eo '[0-9]+\.[0-9]+$' || true)"
here_py="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ "$image_py" != "$here_py" ]]; then
  echo "build-image-stages: the image uses Python ${image_py:-?}, $python is $here_py" >&2
  exit 1
fi

# ---- 1. a clean copy of the tree ----------------------------------------------------------------
step "copying the tree into $work/src"
mkdir -p "$work/src"
# Tracked files plus new ones not yet committed (git would track them), as a build context has them;
# ignored files (venv, BPF objects of this host, dist) stay out, as .dockerignore keeps them out.
(cd "$repo" && git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done \
  | tar --null -T - -cf -) | tar -xf - -C "$work/src"

# ---- 2. build stage -----------------------------------------------------------------------------
step "build stage: docker/build-stage.sh"
PYTHON="$python" bash "$work/src/docker/build-stage.sh" "$work/src" "$work/dist"

# ---- 3. runtime stage ---------------------------------------------------------------------------
step "runtime stage: docker/install-runtime.sh"
PYTHON="$python" bash "$work/src/docker/install-runtime.sh" "$work/dist" "$work/venv"
# The source tree goes away before the check, as it is not in the runtime image.
rm -rf "$work/src"
step "runtime stage: docker/check-runtime.sh"
bash "$repo/docker/check-runtime.sh" "$work/venv"
step "ok"
