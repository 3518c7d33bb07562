// SPDX-License-Identifier: GPL-2.0
/* The floor of any tracepoint-based probe: empty tp_btf programs on the scheduler tracepoints.
 * bench/overhead.py attaches it as an arm so a probe's cost can be read as floor + its own work. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

SEC("tp_btf/sched_switch")
int BPF_PROG(floor_switch) { return 0; }

SEC("tp_btf/sched_wakeup")
int BPF_PROG(floor_wakeup) { return 0; }

char LICENSE[] SEC("license") = "GPL";
