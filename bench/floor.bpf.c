// SPDX-License-Identifier: GPL-2.0
/* The floor of any tracepoint-based probe: empty tp_btf programs on the tracepoints our probes use.
 * bench/overhead.py attaches it as an arm so a probe's cost can be read as floor + its own work:
 * `--wakeup` adds sched_wakeup (what wakeup-based tools attach to), `--all-probes` every tracepoint
 * of the default probes (runqlat, softirq, reclaim, tcpconnect). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

SEC("tp_btf/sched_switch")
int BPF_PROG(floor_switch) { return 0; }

SEC("tp_btf/sched_wakeup")
int BPF_PROG(floor_wakeup) { return 0; }

SEC("tp_btf/softirq_raise")
int BPF_PROG(floor_softirq_raise) { return 0; }

SEC("tp_btf/softirq_entry")
int BPF_PROG(floor_softirq_entry) { return 0; }

SEC("tp_btf/softirq_exit")
int BPF_PROG(floor_softirq_exit) { return 0; }

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(floor_inet_sock_set_state) { return 0; }

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(floor_tcp_retransmit_skb) { return 0; }

SEC("tp_btf/mm_vmscan_direct_reclaim_begin")
int BPF_PROG(floor_direct_reclaim_begin) { return 0; }

SEC("tp_btf/mm_vmscan_direct_reclaim_end")
int BPF_PROG(floor_direct_reclaim_end) { return 0; }

SEC("tp_btf/mm_vmscan_memcg_reclaim_begin")
int BPF_PROG(floor_memcg_reclaim_begin) { return 0; }

SEC("tp_btf/mm_vmscan_memcg_reclaim_end")
int BPF_PROG(floor_memcg_reclaim_end) { return 0; }

char LICENSE[] SEC("license") = "GPL";
