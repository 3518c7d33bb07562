#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The image's build stage, shared by docker/Dockerfile and scripts/build-image-stages.sh so the two
# cannot drift: compile the BPF objects and build the wheel that ships them as package data.
#   docker/build-stage.sh SRC_DIR DIST_DIR      (PYTHON=python3 by default)
# Needs clang, llvm, libbpf-dev, bpftool (optional: without it or without host BTF the Makefile uses the
# vendored bpf/vmlinux/<arch>/vmlinux.h), make and a Python >= 3.11 with pip.
set -euo pipefail
src="${1:?usage: build-stage.sh SRC_DIR DIST_DIR}"
dist="${2:?usage: build-stage.sh SRC_DIR DIST_DIR}"
python="${PYTHON:-python3}"
mkdir -p "$dist"
dist="$(cd "$dist" && pwd)"
cd "$src"

make -s bpf

# Every bpf/*.bpf.c must have produced its object: a missing one would only show at run time on a node.
missing=()
for c in bpf/*.bpf.c; do
  o="probes/bpf_objects/$(basename "${c%.c}").o"
  [[ -s "$o" ]] || missing+=("$o")
done
if ((${#missing[@]})); then
  echo "build-stage: BPF objects not built: ${missing[*]}" >&2
  exit 1
fi

# --no-deps: only our wheel; the runtime stage resolves the dependencies from the registry.
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$dist" .

# The wheel must carry every BPF object (package data), or the agent would need a compiler on the node.
"$python" - "$dist" bpf <<'PY'
import pathlib
import sys
import zipfile

dist, bpf_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheels = sorted(dist.glob("noisyneighbor-*.whl"))
if len(wheels) != 1:
    sys.exit(f"build-stage: expected one noisyneighbor wheel in {dist}, found {[w.name for w in wheels]}")
names = set(zipfile.ZipFile(wheels[0]).namelist())
want = {f"probes/bpf_objects/{c.name[:-2]}.o" for c in bpf_dir.glob("*.bpf.c")}
if not want or want - names:
    sys.exit(f"build-stage: {wheels[0].name} lacks BPF objects: {sorted(want - names) or 'no bpf/*.bpf.c found'}")
print(f"build-stage: {wheels[0].name} with {len(want)} BPF objects")
PY
