// SPDX-License-Identifier: GPL-2.0
/*
 * tcpconnect: map value and event layouts shared with probes/tcpconnect.py (ctypes mirrors them).
 * Only fixed-width types, every struct padded to 8 bytes. Needs nn_events.h (struct nn_hist).
 */
#ifndef NN_TCPCONNECT_H
#define NN_TCPCONNECT_H

#include "nn_events.h"

/* How a connect ended (tcpconnect_event.outcome). */
enum tcpconnect_outcome {
	TCPC_ESTABLISHED = 0, /* SYN_SENT → ESTABLISHED */
	TCPC_FAILED = 1,      /* SYN_SENT → CLOSE with sk_err set (RST, timeout, ICMP): the kernel's AttemptFails */
	TCPC_ABORTED = 2,     /* SYN_SENT → CLOSE without an error after a SYN left: the application gave up */
	TCPC_LOCAL_ERROR = 3, /* SYN_SENT → CLOSE before any SYN left (e.g. no ephemeral port: EADDRNOTAVAIL) */
};

/* Start of a connect (written in connect(), process context). */
struct tcpconnect_start {
	__u64 ts_ns;       /* bpf_ktime_get_ns() at CLOSE → SYN_SENT; 0 while a slot is being filled */
	__u64 cgroup_id;   /* the connecting task's cgroup (v1 cpu controller on v1/hybrid hosts) */
	__u64 task;        /* its task_struct: comm is read from it only for an outlier event, and only
			    * while its pid still matches `tid` (the task may have exited since) */
	__u32 netns;       /* network namespace inode of the socket */
	__u32 pid;         /* tgid of the connecting task */
	__u32 tid;
	__u32 segs_out;    /* tcp_sock.segs_out at the start: no change at the end = no SYN ever left */
	__u32 syn_retrans; /* SYN retransmits of this connect so far */
	__u32 __pad;
};

/*
 * One slot of the direct-mapped in-flight table: owned by the socket whose address is in `sk`
 * (0 = free), one cache line.
 */
struct tcpconnect_slot {
	__u64 sk;
	struct tcpconnect_start start;
	__u64 __pad;
};

/* Aggregation key: one connecting cgroup in one network namespace. */
struct tcpconnect_key {
	__u64 cgroup_id;
	__u32 netns;
	__u32 __pad;
};

/* Per key, one copy every CPU adds to (atomic adds). Counters since load. */
struct tcpconnect_stats {
	struct nn_hist latency;  /* connect() → ESTABLISHED of successful connects */
	__u64 successes;
	__u64 failures;          /* sk_err set: = AttemptFails */
	__u64 refused;           /* ... of which ECONNREFUSED (RST) */
	__u64 timeouts;          /* ... of which ETIMEDOUT (SYN retries exhausted) */
	__u64 aborts;            /* closed while connecting, no error (after a SYN left) */
	__u64 local_errors;      /* closed before any SYN left */
	__u64 syn_retransmits;   /* SYN retransmissions (counted when they happen) */
};

/* Destination key for the top-N table. daddr: 4 bytes for AF_INET, 16 for AF_INET6; rest 0. */
struct tcpconnect_dest_key {
	__u64 cgroup_id;
	__u32 netns;
	__u16 family;
	__u16 dport;       /* host byte order */
	__u8 daddr[16];
};

struct tcpconnect_dest_stats {
	__u64 count;       /* successful connects */
	__u64 sum_ns;      /* their latency */
	__u64 max_ns;      /* largest latency since the entry was created */
	__u64 failures;    /* failed, aborted or local errors */
};

/* Outlier ring buffer: one connect at or above the threshold, or one that did not succeed. */
struct tcpconnect_event {
	__u64 ts_ns;       /* bpf_ktime_get_ns() at the end of the connect */
	__u64 latency_ns;  /* connect start → end */
	__u64 cgroup_id;
	__u32 netns;
	__u32 pid;
	__u32 tid;
	__u16 family;
	__u16 outcome;     /* enum tcpconnect_outcome */
	__s32 error;       /* sk_err at the end (0 on success) */
	__u32 syn_retrans;
	__u16 sport;       /* host byte order */
	__u16 dport;
	__u32 __pad;
	__u8 saddr[16];
	__u8 daddr[16];
	char comm[NN_COMM_LEN];
};

#endif /* NN_TCPCONNECT_H */
