#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Smoke test of an installed runtime venv, run at the end of the image build and by
# scripts/build-image-stages.sh: the package imports, the CLI starts, the BPF objects are inside the
# installed package, libbpf.so.1 loads, and none of it needs a compiler or the source tree.
#   docker/check-runtime.sh VENV_DIR
set -euo pipefail
venv="${1:?usage: check-runtime.sh VENV_DIR}"
# In the image (NN_CHECK_IMAGE=1) the system itself must have no compiler: the runtime stage is meant
# to be compiler-free. Elsewhere (a build host) only the agent's own PATH is restricted below.
if [[ "${NN_CHECK_IMAGE:-0}" == 1 ]]; then
  for tool in clang gcc cc llc bpftool; do
    if command -v "$tool" >/dev/null 2>&1; then
      echo "check-runtime: $tool is in the runtime image ($(command -v "$tool")): it must not ship a compiler" >&2
      exit 1
    fi
  done
fi
# From here on PATH is the venv alone: no clang, llvm, bpftool or make can be found, so any step that
# needed one would fail here rather than on a node.
export PATH="$venv/bin"
# Run from / so that a source tree in the working directory cannot shadow the installed package.
cd /
help="$("$venv/bin/noisyneighbor" --help)"
# The image's CMD is `agent`: once the CLI has that subcommand it must start too.
# (bash only: PATH holds no grep any more.) argparse lists subcommands as {top,agent,...}.
if [[ $help =~ [{,]agent[,}] ]]; then
  "$venv/bin/noisyneighbor" agent --help >/dev/null
elif [[ "${NN_REQUIRE_AGENT:-0}" == 1 ]]; then
  echo "check-runtime: the CLI has no 'agent' subcommand, but the image's CMD is agent" >&2
  exit 1
else
  echo "check-runtime: note: no 'agent' subcommand in this CLI yet (the image's CMD)" >&2
fi
"$venv/bin/python" - <<'PY'
import pathlib
import sys

import actuators  # noqa: F401
import detector  # noqa: F401
import noisyneighbor  # noqa: F401
import probes
from probes.libbpf import Libbpf

venv = pathlib.Path(sys.prefix).resolve()
pkg = pathlib.Path(probes.__file__).resolve().parent
if venv not in pkg.parents:
    sys.exit(f"check-runtime: probes imported from {pkg}, not from the venv {venv}")
objects = sorted(p.name for p in (pkg / "bpf_objects").glob("*.bpf.o"))
if not objects:
    sys.exit(f"check-runtime: no BPF objects in {pkg / 'bpf_objects'}")
Libbpf()  # loads libbpf.so.1 (Debian: libbpf1); raises if it is missing
print(f"check-runtime: ok: {len(objects)} BPF objects in {pkg / 'bpf_objects'}: {', '.join(objects)}")
PY
