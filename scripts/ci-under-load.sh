#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The CI command (.ci/run: setup, lint, the whole suite) on a busy machine, as CI machines are:
# stress-ng keeps CPU 0 busy and a second process does file IO for the whole run. A test that
# only passes on an idle machine fails here instead of on someone's landing.
#
#   scripts/ci-under-load.sh            # one run
#   scripts/ci-under-load.sh -n 3       # three runs in a row; stops at the first failure
#   PYTEST_ARGS="tests/test_exporter.py" scripts/ci-under-load.sh   # a part of the suite
#
# Prints one line per run (result, wall time, load average) and exits non-zero if any run failed or
# a load generator died before the run ended (then the run proves nothing). The load generators are
# this script's children and are stopped on every exit path (trap), never anything else.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=1
while getopts "n:h" opt; do
	case "$opt" in
	n) runs="$OPTARG" ;;
	h) sed -n '2,12p' "$0"; exit 0 ;;
	*) echo "usage: $0 [-n RUNS]" >&2; exit 2 ;;
	esac
done
if ! [[ "$runs" =~ ^[1-9][0-9]*$ ]]; then
	echo "ci-under-load: -n wants a positive number of runs, got '$runs'" >&2
	exit 2
fi
stress=$(command -v stress-ng || true)
if [[ -z "$stress" ]]; then
	echo "ci-under-load: stress-ng not found (apt-get install stress-ng, or scripts/setup.sh test)" >&2
	exit 2
fi

ncpu=$(nproc)
# "The other CPU": the tests pin their own contention to the last CPU (taskset -c $((nproc - 1))),
# so the background spinner takes CPU 0, where it competes with the test runner and the agent.
busy_cpu=0
io_dir=""
load_pids=()
ci_pid=""

stop_ci() {
	# .ci/run runs in its own process group (set -m below): stop exactly that tree. pytest turns
	# TERM into KeyboardInterrupt (tests/conftest.py) and runs fixture teardown, which removes the
	# test cgroups; KILL only if it is still there after 60 s.
	if [[ -n "$ci_pid" ]]; then
		kill -TERM -- "-$ci_pid" 2>/dev/null || true
		local waited=0
		while kill -0 -- "-$ci_pid" 2>/dev/null && ((waited < 60)); do  # anyone left in the group
			sleep 1
			waited=$((waited + 1))
		done
		kill -KILL -- "-$ci_pid" 2>/dev/null || true
		wait "$ci_pid" 2>/dev/null || true
		ci_pid=""
	fi
}

stop_load() {
	local pid
	for pid in "${load_pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${load_pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	load_pids=()
	[[ -n "$io_dir" ]] && rm -rf "$io_dir"
	io_dir=""
}
trap 'stop_ci; stop_load' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_load() {
	# CPU: one spinner pinned to CPU 0. IO: write, fsync and re-read files in io_dir.
	io_dir=$(mktemp -d /var/tmp/nn-ci-load.XXXXXX)  # on disk, not tmpfs: real block IO
	"$stress" --cpu 1 --cpu-method int64 --taskset "$busy_cpu" --timeout 0 --quiet &
	load_pids+=("$!")
	"$stress" --hdd 1 --hdd-bytes 256M --temp-path "$io_dir" --timeout 0 --quiet &
	load_pids+=("$!")
	sleep 1
	local pid
	for pid in "${load_pids[@]}"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "ci-under-load: a load generator (pid $pid) did not start" >&2
			exit 2
		fi
	done
}

load_alive() {
	local pid
	for pid in "${load_pids[@]}"; do
		kill -0 "$pid" 2>/dev/null || return 1
	done
}

failed=0
for ((i = 1; i <= runs; i++)); do
	start_load
	t0=$(date +%s)
	status=0
	# In the background and waited for, so a TERM or Ctrl-C reaches the trap at once (bash runs
	# traps only between foreground commands). Job control gives it its own process group.
	set -m
	CI=true bash .ci/run &
	ci_pid=$!
	set +m
	wait "$ci_pid" || status=$?
	ci_pid=""
	took=$(($(date +%s) - t0))
	alive=yes
	load_alive || alive=no
	stop_load
	read -r load1 load5 _ </proc/loadavg
	result=PASS
	[[ $status -ne 0 ]] && result="FAIL (exit $status)"
	[[ $alive == no ]] && result="$result; a load generator died during the run"
	printf 'ci-under-load: run %d/%d: %s in %dm%02ds (load average 1/5 min at the end: %s %s; %d CPUs, CPU %d busy + file IO)\n' \
		"$i" "$runs" "$result" $((took / 60)) $((took % 60)) "$load1" "$load5" "$ncpu" "$busy_cpu"
	if [[ $status -ne 0 || $alive == no ]]; then
		failed=1
		break
	fi
done
exit "$failed"
