// SPDX-License-Identifier: GPL-2.0
/*
 * reclaim: map value and event layouts shared between bpf/reclaim.bpf.c and probes/reclaim.py
 * (which mirrors them with struct/ctypes). Fixed-width types only, every struct padded to 8 bytes.
 */
#ifndef NN_RECLAIM_H
#define NN_RECLAIM_H

#include "nn_events.h"

/* Which reclaim a task stalled in. Softlimit reclaim (v1 only) runs nested inside direct reclaim or
 * kswapd, so its time is also part of the enclosing direct reclaim: never sum across kinds. */
enum nn_reclaim_kind {
	NN_RECLAIM_DIRECT = 0,    /* global direct reclaim: the node is short of free pages */
	NN_RECLAIM_MEMCG = 1,     /* a memory cgroup hit its limit (v1 limit_in_bytes, v2 max/high) */
	NN_RECLAIM_SOFTLIMIT = 2, /* v1 soft-limit reclaim pass, run by a global reclaimer */
	NN_RECLAIM_KINDS = 3,
};

/* Hash key: the memcg of the stalled task and the kind. */
struct reclaim_key {
	__u64 cgroup_id;
	__u32 kind;
	__u32 pad;
};

/* Per (memcg, kind) and per node (kind): latency.count is the number of reclaim passes. */
struct reclaim_stats {
	struct nn_hist latency;
	__u64 nr_reclaimed; /* pages, as the end tracepoint reports them */
	__u64 no_progress;  /* passes that reclaimed nothing (the road to OOM) */
};

/* Begin state of one task, one slot per kind (softlimit nests inside direct reclaim). */
struct reclaim_begin {
	__u64 begin_ns[NN_RECLAIM_KINDS]; /* 0: not in this kind of reclaim */
	__u32 order[NN_RECLAIM_KINDS];
	__u32 gfp_flags[NN_RECLAIM_KINDS];
};

/* One reclaim pass at or above the stall threshold. */
struct reclaim_event {
	__u64 ts_ns;        /* bpf_ktime_get_ns() at the end */
	__u64 duration_ns;  /* begin → end */
	__u64 cgroup_id;    /* memcg of the stalled task */
	__u64 nr_reclaimed; /* pages */
	__u32 pid;          /* thread id */
	__u32 tgid;
	__u32 kind;         /* enum nn_reclaim_kind */
	__u32 order;        /* allocation order that triggered it */
	__u32 gfp_flags;
	__u32 cpu;
	char comm[NN_COMM_LEN];
};

#endif /* NN_RECLAIM_H */
