// SPDX-License-Identifier: GPL-2.0
/*
 * runqlat: map value and event layouts shared between bpf/runqlat.bpf.c and probes/runqlat.py
 * (which mirrors them with struct/ctypes and declares the map sizes it decodes: MAP_LAYOUTS, checked
 * against the object's BTF at load). Fixed-width types only, every struct padded to 8 bytes.
 */
#ifndef NN_RUNQLAT_H
#define NN_RUNQLAT_H

#include "nn_events.h"

/* Per task (task storage, tp_btf flavour): never read by userspace. */
struct task_wait {
	__u64 queued_ns; /* when it became runnable; 0 while running or sleeping */
};

/* runqlat: one runqueue wait above the outlier threshold. */
struct runq_event {
	__u64 ts_ns;      /* bpf_ktime_get_ns() at switch-in */
	__u64 wait_ns;    /* runnable → running */
	__u64 cgroup_id;  /* the waiting task's cgroup */
	__u64 prev_cgroup_id; /* the cgroup of the task that ran right before it on this CPU */
	__u32 pid;        /* thread id */
	__u32 tgid;
	__u32 prev_pid;
	__u32 cpu;
	char comm[NN_COMM_LEN];
	char prev_comm[NN_COMM_LEN];
};

/*
 * runqlat, sched_info flavour: per cgroup, the wait distribution and who ran while it waited.
 * Every wait is split exactly: own + foreign + idle + unknown + migrated == hist.sum_ns.
 */
struct runq_cgroup_stats {
	struct nn_hist hist;
	__u64 own_wait_ns;      /* a task of the same cgroup ran on the CPU meanwhile */
	__u64 foreign_wait_ns;  /* another cgroup ran (per culprit: the runq_culprits matrix) */
	__u64 idle_wait_ns;     /* the idle task ran (wakeup latency of an idle CPU) */
	__u64 unknown_wait_ns;  /* older than the per-CPU slice ring (or no bpf_loop in this kernel) */
	__u64 migrated_wait_ns; /* waited on another CPU before the load balancer moved it */
	__u64 own_preemptions;  /* switched out while runnable, for a task of the same cgroup */
	__u64 foreign_preemptions; /* ... for a task of another cgroup (or idle) */
	__u64 cgroup_id;        /* whose slot this CPU's copy is (0: unused; userspace zeroes freed slots) */
};

/* The victim x culprit matrix: who ran (culprit) while a task of `victim` waited. */
struct runq_culprit_key {
	__u64 victim_cgroup_id;
	__u64 culprit_cgroup_id;
};

struct runq_culprit_stats {
	__u64 wait_ns;     /* victim wait covered by the culprit's slices */
	__u64 count;       /* culprit turns on the CPU (consecutive slices of it merged) inside victim waits */
	__u64 preemptions; /* victim tasks switched out while runnable in favour of the culprit */
	struct runq_culprit_key pair; /* whose slot this CPU's copy is (victim 0: unused) */
};

/*
 * The counterfactual of one (victim, culprit) pair, indexed like runq_culprits: how the victim's wait
 * histogram moves when the culprit's share of each wait is taken out. A wait of `full` ns of which the
 * culprit ran `part` ns adds -1 at slot(full) and +1 at slot(full - part) (nothing when the slot stays):
 * the victim's histogram plus these counts is its histogram without the culprit.
 */
/*
 * Only waits of at least this long are moved: the exporter's first bucket holds every wait below 128 µs
 * and SLOs are in milliseconds, so the counterfactual is exact from there up; the µs-scale waits of a
 * busy switch path (perf's pipe ping-pong) then pay one compare.
 */
#define RUNQ_CF_MIN_NS 128000ULL

/*
 * `node_slots`: the further move of the same waits when the kernel work's share of each one is taken
 * out too (the node's kswapd, kcompactd, kdamond and ksoftirqd slices: RUNQ_SLICE_KERNEL_WORK; memory
 * management for the memory a culprit took, softirq work its packets made). A wait of `full` ns of which the culprit ran `part` and
 * the kernel work `node` adds -1 at slot(full - part) and +1 at slot(full - part - node): slots +
 * node_slots is the victim's histogram without the culprit and that kernel work.
 * The node's own pair (culprit `node_cgroup_id`) is different: its node_slots take the kernel work
 * alone out of every wait that had any, slot(full) to slot(full - node), for the victim's histogram
 * without it whoever else ran (the cost of a culprit that never ran on the victim's CPU).
 */
struct runq_counterfactual {
	__s64 slots[NN_HIST_SLOTS];
	__s64 node_slots[NN_HIST_SLOTS];
	__s64 node_ns; /* the kernel work in those waits, summed (the wait per second without both) */
};

#define RUNQ_RING_SLOTS 64 /* power of 2: the finished slices each CPU remembers (consecutive ones of one cgroup merged) */

/* One finished slice on a CPU: from `start` (rq clock) to the next slice's start. */
struct runq_slice {
	__u64 start;
	__u64 cgroup_id;  /* 0: the idle task; | RUNQ_SLICE_KERNEL_WORK: kernel work ran (kswapd, kcompactd, kdamond, ksoftirqd) */
	__u64 softirq_ns; /* the CPU's runq_cpu_state.softirq_ns when it began: the next slice's minus this is the softirq run in it */
};

/*
 * Softirq work run at interrupt exit (or at a local_bh_enable()) runs on top of whatever task is on the
 * CPU, in its slice: the idle task's, a victim's own thread's, a culprit's. The scheduler sees that
 * task's time; runqlat_softirq_* sum it per CPU so a wait's part of it is taken out with the kernel work.
 * The last runs are kept to find how much of it came after a wait began (softirq_ns_at()).
 */
#define RUNQ_SOFTIRQ_MARKS 8 /* power of 2 */
#define RUNQ_SOFTIRQ_RUN_GAP_NS 2000ULL /* a vector's entry this soon after the last exit continues the run */

/*
 * A run of softirq work on a CPU: vectors handled back to back (one __do_softirq(), or a sender's sends
 * a few µs apart) are one run, whose softirq work is total - before of its exit - entry.
 */
struct runq_softirq_mark {
	__u64 entry;  /* ktime of its first softirq_entry */
	__u64 exit;   /* ktime of its last softirq_exit */
	__u64 before; /* runq_cpu_state.softirq_ns before it */
	__u64 total;  /* runq_cpu_state.softirq_ns after it */
};

/* Set in a ring slice's cgroup_id (kernfs ids never reach bit 63: 2^31 id wraps first). */
#define RUNQ_SLICE_KERNEL_WORK (1ULL << 63)

#define RUNQ_SLOT_CACHE 16 /* power of 2: per-CPU cache of cgroup id -> cgroup_runq slot */

/* A cached cgroup_slots entry (the slot's own cgroup_id is checked before use). */
struct runq_slot_cache_entry {
	__u64 cgroup_id;
	__u64 slot;
};

#define RUNQ_PAIR_CACHE 16 /* power of 2: per-CPU cache of (victim, culprit) -> runq_culprits slot */

/* A cached culprit_slots entry (the slot's own pair is checked before use). */
struct runq_pair_cache_entry {
	struct runq_culprit_key pair;
	__u64 slot;
};

/* Per CPU: the current slice and the ring of finished ones (only ever touched by that CPU). */
struct runq_cpu_state {
	__u64 slice_start;       /* rq clock at the last sched_switch: the current slice began */
	__u64 cur_cgroup_id;     /* cgroup of the task switched in then: `prev`'s cgroup next time */
	__u32 cur_pid;           /* its pid, to check that it is indeed `prev` */
	__u32 head;              /* ring[(head - 1) % RUNQ_RING_SLOTS] is the newest finished slice */
	__u64 culprit_drops;     /* matrix updates lost to a full runq_culprits map */
	__u64 culprit_drop_ns;   /* the foreign wait those carried */
	struct runq_slice ring[RUNQ_RING_SLOTS];
	struct runq_slot_cache_entry slot_cache[RUNQ_SLOT_CACHE]; /* cgroup id -> cgroup_runq slot, direct-mapped */
	struct runq_pair_cache_entry pair_cache[RUNQ_PAIR_CACHE]; /* (victim, culprit) -> runq_culprits slot */
	__u64 softirq_ns;        /* softirq work run on this CPU since load, summed (ktime ns) */
	__u64 softirq_entry;     /* ktime of the running softirq vector's entry; 0 outside one */
	__u64 slice_softirq_ns;  /* softirq_ns when the current slice began */
	__u32 mark_head;         /* marks[(mark_head - 1) % RUNQ_SOFTIRQ_MARKS] is the newest run */
	__u32 cpu_plus_one;      /* this CPU's number + 1 (0: not known yet): its runq_cpu_hist entry */
	struct runq_softirq_mark marks[RUNQ_SOFTIRQ_MARKS];
};

/*
 * The wait distribution of everything that ran on one CPU, in a shared array indexed by CPU (each CPU
 * writes only its own entry): userspace reads it in place and decodes the CPUs that moved, where the
 * whole per-CPU state (2.5 KB a CPU) was copied out every tick. Five cache lines: no line is shared
 * by two CPUs' entries.
 */
struct runq_cpu_hist {
	struct nn_hist hist;
	__u64 pad[5];
};

#endif /* NN_RUNQLAT_H */
