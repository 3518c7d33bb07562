// SPDX-License-Identifier: GPL-2.0
/*
 * softirq probe: map values and the stall event (mirrored by ctypes/struct in probes/softirq.py).
 * Fixed-width types only, every struct padded to 8 bytes.
 */
#ifndef NN_SOFTIRQ_H
#define NN_SOFTIRQ_H

#include "nn_events.h"

/* HI, TIMER, NET_TX, NET_RX, BLOCK, IRQ_POLL, TASKLET, SCHED, HRTIMER, RCU (NR_SOFTIRQS since 2.6.32). */
#define NN_NR_SOFTIRQS 10

/*
 * Per CPU, per vector: the raise waiting for its entry, and the run in progress. Hot path only,
 * never read by userspace. Stall context is kept as the raising task's address and pid, not its
 * cgroup and comm: those are read from the task only when a stall event is sent (rare), which keeps
 * the pointer chase and the comm copy off the per-raise path. The pid read back then tells whether
 * the address still holds that task.
 */
struct softirq_pending {
	__u64 raise_ns;        /* first raise of the still-pending vector; 0 if none seen */
	__u64 raise_task;      /* task_struct of current at that raise (only kept when stall events are on) */
	__u32 raise_pid;
	__u32 raise_tgid;
	/* The run in progress (softirq_entry → softirq_exit), copied at entry so a raise that
	 * interrupts the handler cannot change what the exit reports. */
	__u64 entry_ns;        /* 0 when no run is in progress */
	__u64 run_raise_ns;    /* the raise this run consumed; 0 if it was not seen */
	__u64 run_raise_task;
	__u32 run_raise_pid;
	__u32 run_raise_tgid;
};

/*
 * Per CPU, per vector: cumulative since load. One slot of the `stats` array (CPU c's vector v at
 * c * NN_NR_SOFTIRQS + v), written only by its CPU, padded to whole cache lines so two CPUs never
 * write the same line.
 */
struct softirq_stats {
	struct nn_hist delay;   /* raise → entry, only for entries whose raise was seen */
	struct nn_hist runtime; /* entry → exit */
	__u64 entries;          /* every softirq_entry, raise seen or not: matches /proc/softirqs */
	__u64 _pad;
};

/* A softirq run whose raise → entry delay or entry → exit run time reached the threshold. */
struct softirq_stall_event {
	__u64 ts_ns;      /* bpf_ktime_get_ns() at softirq_exit */
	__u64 delay_ns;   /* raise → entry; 0 when the raise was not seen */
	__u64 runtime_ns; /* entry → exit */
	__u64 raise_cgroup_id; /* cgroup of `current` at the raise (what ran when it became pending), read at
				* the event; 0 if that task has exited since */
	__u64 entry_cgroup_id; /* cgroup of `current` at entry/exit (whose context ran the softirq) */
	__u32 cpu;
	__u32 vec;
	__u32 raise_pid;
	__u32 raise_tgid;
	__u32 entry_pid;
	__u32 entry_tgid;
	__u8 in_ksoftirqd; /* ran in this CPU's ksoftirqd thread */
	__u8 raise_seen;   /* delay_ns and the raise_* fields are valid */
	__u8 _pad[6];
	char raise_comm[NN_COMM_LEN]; /* read at the event, like raise_cgroup_id; empty if it has exited */
	char entry_comm[NN_COMM_LEN];
};

#endif /* NN_SOFTIRQ_H */
