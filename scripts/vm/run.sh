#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Run one command in the VM lane (cgroup v2, Debian 12's 6.1): see scripts/vm/run.py --help.
#   scripts/vm/run.sh --cpus 2 --memory 2G -- .venv/bin/pytest -q -m vm tests/test_x.py
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="$root/.venv/bin/python"
[[ -x "$py" ]] || py=python3
exec "$py" "$root/scripts/vm/run.py" "$@"
