// SPDX-License-Identifier: GPL-2.0
/*
 * Runqueue latency per cgroup: the time a task spends runnable but not running.
 *
 * Start: sched_wakeup / sched_wakeup_new (the wakee), or sched_switch for a `prev` that is still
 * runnable (preempted or yielding). End: sched_switch for `next`. The wait is charged to the
 * *wakee's* cgroup, read from the task argument — never from `current`, which is the waker in
 * sched_wakeup and `prev` in sched_switch.
 *
 * Three flavours, the loader picks the cheapest the kernel supports:
 * - sched_info (CONFIG_SCHED_INFO and CONFIG_FAIR_GROUP_SCHED in BTF): the kernel already
 *   stamps every enqueue in task->sched_info.last_queued on the rq clock. One sched_switch program
 *   reads rq->clock - last_queued — no wakeup program, no clock call — which is by construction
 *   what /proc/<pid>/schedstat accounts. A queued task moved by the load balancer has the part of
 *   its wait before the move added to sched_info.run_delay at dequeue; we add run_delay's growth
 *   since the task's previous switch-in (one task-storage slot) so the wait stays whole.
 * - tp_btf: wakeup/wakeup_new → switch with the start time in task storage.
 * - raw_tp (kernels without BTF-typed tracepoints): the same with a bounded pid hash, because raw
 *   task pointers cannot be passed to task storage.
 * Everywhere, aggregation goes to per-CPU maps: no event writes a map all CPUs contend on.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "nn_common.h"

#define MAX_CGROUPS 16384
#define MAX_FALLBACK_TASKS 65536

/* Set by the loader before load. */
const volatile bool v1_cpu_cgroup = false;     /* key by the v1 cpu controller's cgroup */
const volatile __u64 outlier_threshold_ns = 0; /* 0: no outlier events */

struct task_wait {
	__u64 queued_ns;      /* tp_btf flavour: when it became runnable; 0 while running or sleeping */
	__u64 run_delay_seen; /* sched_info flavour: sched_info.run_delay after its last switch-in */
	__u64 seen_valid;     /* run_delay_seen is set (storage is created lazily) */
};


struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct task_wait);
} task_wait SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FALLBACK_TASKS);
	__type(key, __u32);
	__type(value, __u64);
} fallback_queued_ns SEC(".maps");

/* Per cgroup id: the wait distribution (per CPU; userspace sums the CPUs). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, MAX_CGROUPS);
	__type(key, __u64);
	__type(value, struct nn_hist);
} cgroup_runq SEC(".maps");

/* Per CPU: the wait distribution of everything that ran there. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nn_hist);
} cpu_runq SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} outliers SEC(".maps");

static const struct nn_hist zero_hist;

/* ---- start-time storage: task storage (tp_btf) or pid hash (raw_tp) ---------------------- */

static __always_inline void mark_queued_storage(struct task_struct *p, __u64 now, bool overwrite)
{
	struct task_wait *w = bpf_task_storage_get(&task_wait, p, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);

	if (!w) {
		count_drop(NN_DROP_TASK_STORAGE);
		return;
	}
	/* A wakeup of a task that is already queued (ttwu on a runnable task) keeps the older time. */
	if (overwrite || !w->queued_ns)
		w->queued_ns = now;
}

static __always_inline void clear_queued_storage(struct task_struct *p)
{
	struct task_wait *w = bpf_task_storage_get(&task_wait, p, 0, 0);

	if (w)
		w->queued_ns = 0;
}

static __always_inline __u64 take_queued_storage(struct task_struct *p)
{
	struct task_wait *w = bpf_task_storage_get(&task_wait, p, 0, 0);
	__u64 t;

	if (!w)
		return 0;
	t = w->queued_ns;
	w->queued_ns = 0;
	return t;
}

static __always_inline void mark_queued_hash(__u32 pid, __u64 now, bool overwrite)
{
	__u64 *t = bpf_map_lookup_elem(&fallback_queued_ns, &pid);

	if (t) {
		if (overwrite || !*t)
			*t = now;
		return;
	}
	if (bpf_map_update_elem(&fallback_queued_ns, &pid, &now, BPF_NOEXIST))
		count_drop(NN_DROP_START_MAP_FULL);
}

static __always_inline __u64 take_queued_hash(__u32 pid)
{
	__u64 *t = bpf_map_lookup_elem(&fallback_queued_ns, &pid);
	__u64 v;

	if (!t)
		return 0;
	v = *t;
	bpf_map_delete_elem(&fallback_queued_ns, &pid);
	return v;
}

/* ---- aggregation ----------------------------------------------------------------------------- */

static __always_inline void account_cgroup(struct task_struct *prev, struct task_struct *next,
					   __u64 cgid, __u64 wait_ns)
{
	__u32 zero = 0;
	struct nn_hist *h;

	h = bpf_map_lookup_elem(&cgroup_runq, &cgid);
	if (!h) {
		bpf_map_update_elem(&cgroup_runq, &cgid, &zero_hist, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&cgroup_runq, &cgid);
		if (!h) {
			count_drop(NN_DROP_KEY_MAP_FULL);
			goto per_cpu;
		}
	}
	nn_hist_add(h, wait_ns);
per_cpu:
	h = bpf_map_lookup_elem(&cpu_runq, &zero);
	if (h)
		nn_hist_add(h, wait_ns);

	if (outlier_threshold_ns && wait_ns >= outlier_threshold_ns) {
		struct runq_event *e = bpf_ringbuf_reserve(&outliers, sizeof(*e), 0);

		if (!e) {
			count_drop(NN_DROP_RINGBUF_FULL);
			return;
		}
		e->ts_ns = bpf_ktime_get_ns();
		e->wait_ns = wait_ns;
		e->cgroup_id = cgid;
		e->prev_cgroup_id = nn_task_cgroup_id(prev, v1_cpu_cgroup);
		e->pid = BPF_CORE_READ(next, pid);
		e->tgid = BPF_CORE_READ(next, tgid);
		e->prev_pid = BPF_CORE_READ(prev, pid);
		e->cpu = bpf_get_smp_processor_id();
		BPF_CORE_READ_STR_INTO(&e->comm, next, comm);
		BPF_CORE_READ_STR_INTO(&e->prev_comm, prev, comm);
		bpf_ringbuf_submit(e, 0);
	}
}

static __always_inline void account(struct task_struct *prev, struct task_struct *next, __u64 wait_ns)
{
	account_cgroup(prev, next, nn_task_cgroup_id(next, v1_cpu_cgroup), wait_ns);
}

/*
 * The same cgroup id through direct BTF pointer walks: in tp_btf programs these compile to plain
 * loads, where BPF_CORE_READ costs one bpf_probe_read_kernel() call per hop (~100 ns for five).
 */
static __always_inline __u64 task_cgroup_id_btf(struct task_struct *t)
{
	if (v1_cpu_cgroup) {
		int cpu_id = bpf_core_enum_value(enum cgroup_subsys_id, cpu_cgrp_id);

		if (cpu_id < 0 || cpu_id >= CGROUP_SUBSYS_COUNT)
			return 0;
		return t->cgroups->subsys[cpu_id]->cgroup->kn->id;
	}
	return t->cgroups->dfl_cgrp->kn->id;
}

/* ---- sched_info: the kernel's own enqueue stamps, one program -------------------------------- */

SEC("tp_btf/sched_switch")
int BPF_PROG(runqlat_switch_schedinfo, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	struct task_wait *w;
	__u64 queued, run_delay, pending, wait_ns;

	if (!next->pid)
		return 0;
	queued = next->sched_info.last_queued;
	if (!queued) {
		/*
		 * No enqueue stamp (preempted after setting a sleep state): the kernel counts the arrival
		 * (pcount) with no wait, and so do we, so event counts stay equal to timeslices.
		 */
		account_cgroup(prev, next, task_cgroup_id_btf(next), 0);
		return 0;
	}
	/*
	 * This CPU's rq clock, as sched_info_arrive() will read it: set_task_rq() points every task's
	 * se.cfs_rq at a cfs_rq of its CPU whatever its class, and `next` runs here. (The per-CPU
	 * `runqueues` symbol would be simpler but needs CONFIG_KALLSYMS_ALL.)
	 */
	pending = next->se.cfs_rq->rq->clock - queued;
	if ((__s64)pending < 0)
		pending = 0;
	wait_ns = pending;
	run_delay = next->sched_info.run_delay;
	w = bpf_task_storage_get(&task_wait, next, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (w) {
		/* Wait accounted at a dequeue since it last ran (a queued task was migrated). */
		if (w->seen_valid && run_delay > w->run_delay_seen)
			wait_ns += run_delay - w->run_delay_seen;
		/* sched_info_arrive() is about to add `pending` to run_delay. */
		w->run_delay_seen = run_delay + pending;
		w->seen_valid = 1;
	} else {
		count_drop(NN_DROP_TASK_STORAGE);
	}
	account_cgroup(prev, next, task_cgroup_id_btf(next), wait_ns);
	return 0;
}

/* ---- tp_btf: BTF-typed tracepoints, task storage --------------------------------------------- */

SEC("tp_btf/sched_wakeup")
int BPF_PROG(runqlat_wakeup_btf, struct task_struct *p)
{
	if (p->pid)
		mark_queued_storage(p, bpf_ktime_get_ns(), false);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(runqlat_wakeup_new_btf, struct task_struct *p)
{
	if (p->pid)
		mark_queued_storage(p, bpf_ktime_get_ns(), false);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(runqlat_switch_btf, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 queued;

	if (prev->pid) {
		/*
		 * Still on the runqueue: preempted (even if it had already set a sleep state — a task
		 * preempted between set_current_state() and schedule() stays queued), or yielding.
		 */
		if (preempt || nn_task_state(prev) == TASK_RUNNING)
			mark_queued_storage(prev, now, true);
		else
			clear_queued_storage(prev); /* went to sleep: a stale start must not survive */
	}
	if (!next->pid)
		return 0;
	queued = take_queued_storage(next);
	if (queued && now > queued)
		account_cgroup(prev, next, task_cgroup_id_btf(next), now - queued);
	return 0;
}

/* ---- raw_tp fallback: untyped arguments, pid hash -------------------------------------------- */

SEC("raw_tp/sched_wakeup")
int BPF_PROG(runqlat_wakeup_raw, struct task_struct *p)
{
	__u32 pid = BPF_CORE_READ(p, pid);

	if (pid)
		mark_queued_hash(pid, bpf_ktime_get_ns(), false);
	return 0;
}

SEC("raw_tp/sched_wakeup_new")
int BPF_PROG(runqlat_wakeup_new_raw, struct task_struct *p)
{
	__u32 pid = BPF_CORE_READ(p, pid);

	if (pid)
		mark_queued_hash(pid, bpf_ktime_get_ns(), false);
	return 0;
}

SEC("raw_tp/sched_switch")
int BPF_PROG(runqlat_switch_raw, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 prev_pid = BPF_CORE_READ(prev, pid);
	__u32 next_pid = BPF_CORE_READ(next, pid);
	__u64 queued;

	if (prev_pid) {
		if (preempt || nn_task_state(prev) == TASK_RUNNING)
			mark_queued_hash(prev_pid, now, true);
		else
			bpf_map_delete_elem(&fallback_queued_ns, &prev_pid);
	}
	if (!next_pid)
		return 0;
	queued = take_queued_hash(next_pid);
	if (queued && now > queued)
		account(prev, next, now - queued);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
