# SPDX-License-Identifier: Apache-2.0
# noisyneighbor — build, run, test. Everything a fresh machine needs is installed by scripts/setup.sh.
SHELL := /bin/bash
ARCH := $(shell uname -m | sed -e 's/x86_64/x86/' -e 's/aarch64/arm64/')
BPF_SRC := $(wildcard bpf/*.bpf.c)
BPF_HDR := $(wildcard bpf/*.h)
BPF_OUT := probes/bpf_objects
BPF_OBJ := $(patsubst bpf/%.bpf.c,$(BPF_OUT)/%.bpf.o,$(BPF_SRC))
VMLINUX_VENDORED := bpf/vmlinux/$(shell uname -m)/vmlinux.h
VMLINUX := bpf/.output/vmlinux.h
CLANG ?= clang
BPF_CFLAGS := -g -O2 -target bpf -D__TARGET_ARCH_$(ARCH) -Wall -Wno-unused-function \
	-I bpf/.output -I bpf -I /usr/include/$(shell uname -m)-linux-gnu
# Bench-only BPF sources (bench/bpf/): built for bench/variant_objects.py, never shipped.
BENCH_BPF_SRC := $(wildcard bench/bpf/*.bpf.c)
BENCH_BPF_OUT ?= bench/.output
PY := .venv/bin/python

.PHONY: all setup run test test-vm test-vm-large test-vm-smoke lint bpf bench clean
all: bpf

setup:
	@scripts/setup.sh run

# The main job: noisyneighbor on this node.
run:
	@scripts/setup.sh run
	.venv/bin/noisyneighbor top

# The tests (CI calls this through .ci/run).
test:
	@scripts/setup.sh test
	.venv/bin/ruff check .
	.venv/bin/pytest -q $(PYTEST_ARGS)

# The kernel-facing tests (marker vm) in the VM lane: Debian 12's 6.1 kernel, a pure cgroup v2
# hierarchy (scripts/vm/). One line per failure at the end, the exit status is pytest's; a guest that
# does not boot or runs past its time is a failure. VM_ARGS="--cpus 4 --memory 4G --disk 1G --timeout 3600"
# (--disk: an ext4 scratch disk, for page cache a memory cgroup can reclaim; see tests/conftest.py disk_dir).
# The per-test timeout is raised for TCG, where Python runs about 10 times slower; -v names each test
# as it starts (a slow guest is otherwise silent for minutes). 4 GiB of guest memory: twice in a 2 GiB
# guest the whole lane stopped making progress (pytest's own per-test timeout never fired) in tests that
# flood softirq or kill agents; with 4 GiB the same tree ran green in 9 minutes.
VM_ARGS ?= --memory 4G --disk 1G --timeout 5400
# Only the files holding vm tests are collected in the guest: importing every test module there
# takes minutes under TCG.
VM_TESTS ?= $(shell grep -l 'pytest.mark.vm' tests/test_*.py)
# The smoke collects only the files that hold smoke tests: importing a test module takes seconds in a TCG guest.
VM_SMOKE_TESTS ?= $(shell grep -l 'pytest.mark.smoke' tests/test_*.py)
test-vm:
	@scripts/setup.sh vm
	scripts/vm/run.sh $(VM_ARGS) -- .venv/bin/pytest -v -m vm -rfE -p no:cacheprovider --timeout 1200 $(PYTEST_ARGS) $(VM_TESTS)

# The large-node lane: the same VM booted with possible_cpus=192 (every per-CPU map sized for a 192-CPU
# node, 2 CPUs online), hundreds of kubelet-shaped pods (tests marked large_node; they skip elsewhere).
test-vm-large:
	@scripts/setup.sh vm
	scripts/vm/run.sh $(VM_ARGS) --memory 4G --append possible_cpus=192 -- .venv/bin/pytest -v -m large_node -rfE -p no:cacheprovider --timeout 1800 $(PYTEST_ARGS) tests/test_large_node.py

# CI's part of the lane (.ci/run, after the host suite): the tests marked both vm and smoke.
test-vm-smoke:
	@scripts/setup.sh vm
	scripts/vm/run.sh $(VM_ARGS) -- .venv/bin/pytest -v -m "vm and smoke" -rfE -p no:cacheprovider --timeout 1200 $(PYTEST_ARGS) $(VM_SMOKE_TESTS)

lint:
	.venv/bin/ruff check .

# The interference scenario benchmark (bench/scenarios): one command, one report.
#   make bench BENCH_ARGS="--quick" | BENCH_ARGS="--only cpu-neighbor --json /tmp/bench.json"
bench:
	@scripts/setup.sh bench
	-@bench/bcc_env.sh
	$(PY) -m bench.scenarios --markdown --docs docs/benchmarks.md $(BENCH_ARGS)

# The VM lane's mitigate rows (docs/benchmarks.md, "Scenario detect rows in the VM lane"): cgroup v2 on
# Debian's 6.1 under TCG, where latencies are inexact, so "recovered" is judged on the kernel's counts.
#   make bench-vm-mitigate BENCH_ARGS="--json .vm_mitigate.json"
.PHONY: bench-vm-mitigate
bench-vm-mitigate:
	@scripts/setup.sh vm
	scripts/vm/run.sh --cpus 2 --memory 4G $(VM_ARGS) -- .venv/bin/python -m bench.scenarios \
		--only cpu-neighbor self-throttle-bursty global-reclaim --modes mitigate --no-peers --no-overhead \
		--softirq-floor --judge-counts --run-s 24 --markdown $(BENCH_ARGS)

# The churn soak (issue 39, bench/soak.py): one agent, 300 pods alive, 3,300 made (each replaced once
# to warm up, then 9 minutes of churn) with compressed vanish-grace and quiet-pair timings, a known hog
# next to a known victim every 45 s; exits 1 on a table drop, a wrong culprit, or series/RSS/tables not
# back to steady. ~13 min.
#   make bench-soak BENCH_ARGS="--minutes 2 --pods 100 --json /tmp/soak.json"
.PHONY: bench-soak
bench-soak:
	$(PY) -m bench.soak $(BENCH_ARGS)

bpf: $(BPF_OBJ)

# vmlinux.h from this kernel's BTF when it has one; otherwise the vendored copy (see bpf/README.md).
# VMLINUX_SOURCE=vendored: always the vendored copy (the image build: the same header on every builder).
VMLINUX_SOURCE ?= auto
$(VMLINUX):
	@mkdir -p $(@D)
	@if [ "$(VMLINUX_SOURCE)" != vendored ] && [ -r /sys/kernel/btf/vmlinux ] && command -v bpftool >/dev/null; then \
		bpftool btf dump file /sys/kernel/btf/vmlinux format c > $@.tmp && mv $@.tmp $@; \
	else \
		echo "bpf: no /sys/kernel/btf/vmlinux or bpftool: using $(VMLINUX_VENDORED)" >&2; \
		cp $(VMLINUX_VENDORED) $@; \
	fi

$(BPF_OUT)/%.bpf.o: bpf/%.bpf.c $(BPF_HDR) $(VMLINUX)
	@mkdir -p $(@D)
	$(CLANG) $(BPF_CFLAGS) -c $< -o $@.tmp && mv $@.tmp $@

.PHONY: bench-bpf
bench-bpf: $(patsubst bench/bpf/%.bpf.c,$(BENCH_BPF_OUT)/%.bpf.o,$(BENCH_BPF_SRC))

# A bench variant includes the shipped source it varies (bpf/ is on the include path).
$(BENCH_BPF_OUT)/%.bpf.o: bench/bpf/%.bpf.c $(BPF_SRC) $(BPF_HDR) $(VMLINUX)
	@mkdir -p $(@D)
	$(CLANG) $(BPF_CFLAGS) -c $< -o $@.tmp && mv $@.tmp $@

clean:
	rm -rf bpf/.output $(BPF_OUT) $(BENCH_BPF_OUT)

# Probe overhead: nothing vs noisyneighbor vs bcc's runqlat, alternating arms (bench/overhead.py --help).
# bcc_env.sh gives bcc kernel headers; if it fails, that arm is reported unavailable.
#   make bench-overhead BENCH_ARGS="--rounds 7 --markdown --json /tmp/overhead.json"
.PHONY: bench-overhead
bench-overhead:
	@scripts/setup.sh bench
	-@bench/bcc_env.sh
	$(PY) bench/overhead.py $(BENCH_ARGS)
