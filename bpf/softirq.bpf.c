// SPDX-License-Identifier: GPL-2.0
/*
 * Softirq stalls per CPU and vector: the raise → entry delay (how long a pending softirq waited
 * to run) and the entry → exit run time, from irq:softirq_raise / softirq_entry / softirq_exit.
 *
 * Softirq time belongs to the CPU it ran on, never to `current` (the task it interrupted, or
 * ksoftirqd): aggregation is per CPU and vector only. The tasks are named in stall events, as
 * context: what was running when the vector was raised, and in whose context it finally ran.
 *
 * State is per CPU and indexed by vector (pending bits are per CPU: a raise is always consumed on
 * the CPU that raised it). A raise of a vector that is already pending keeps the oldest time; an
 * entry consumes it. Entries are counted whether or not their raise was seen (raised before attach,
 * or by a path that bypasses the tracepoint), so `entries` matches /proc/softirqs, which the kernel
 * increments right before softirq_entry.
 *
 * Concurrency on one CPU: softirq_raise always runs with hardirqs off; entry and exit run with
 * hardirqs on, so a raise may interrupt them (never the reverse), and softirqs do not nest. A raise
 * landing between entry's read and clear of raise_ns is folded into the run being started, as the
 * kernel does with a vector re-raised while its pending word is being processed.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "nn_common.h"
#include "softirq.h"

_Static_assert(sizeof(struct softirq_stall_event) == 104, "probes/softirq.py _StallEvent mirrors this layout");
_Static_assert(sizeof(struct softirq_stats) == 2 * sizeof(struct nn_hist) + 16, "probes/softirq.py _STATS");
_Static_assert(sizeof(struct softirq_stats) % 64 == 0, "a CPU's vector is whole cache lines");

#ifndef PF_KTHREAD
#define PF_KTHREAD 0x00200000
#endif

/* Set by the loader before load. */
const volatile bool v1_cpu_cgroup = false;    /* key tasks' cgroups by the v1 cpu controller */
const volatile __u64 stall_threshold_ns = 0;  /* 0: no stall events (and no raise context kept) */

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NN_NR_SOFTIRQS);
	__type(key, __u32);
	__type(value, struct softirq_pending);
} pending SEC(".maps");

/*
 * Not a per-CPU map: one array of every CPU's vectors, mmapable, so the reader looks at two counters
 * of each in place and copies out only those that moved (a per-CPU map's lookup copies every CPU's
 * histograms, 1 MB a tick at 192 CPUs). Each CPU writes only its own slots, so the adds stay plain.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, NN_NR_SOFTIRQS); /* the loader sets it: possible CPUs x NN_NR_SOFTIRQS */
	__type(key, __u32);
	__type(value, struct softirq_stats);
} stats SEC(".maps");

/* This CPU's statistics of a vector (vec < NN_NR_SOFTIRQS). */
static __always_inline struct softirq_stats *cpu_stats(__u32 vec)
{
	__u32 i = bpf_get_smp_processor_id() * NN_NR_SOFTIRQS + vec;

	return bpf_map_lookup_elem(&stats, &i);
}

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} stalls SEC(".maps");

/* A kernel thread named ksoftirqd/N (comm alone could be spoofed by a user task). */
static __always_inline bool in_ksoftirqd(unsigned int task_flags, const char *comm)
{
	if (!(task_flags & PF_KTHREAD))
		return false;
	return comm[0] == 'k' && comm[1] == 's' && comm[2] == 'o' && comm[3] == 'f' && comm[4] == 't' &&
	       comm[5] == 'i' && comm[6] == 'r' && comm[7] == 'q' && comm[8] == 'd' && comm[9] == '/';
}

/* ---- shared bodies --------------------------------------------------------------------------- */

/*
 * `btf` is a constant per program (the bodies are always inlined): the tp_btf programs read task
 * fields with direct loads, the raw_tp ones with bpf_probe_read_kernel() (untyped pointers).
 */
static __always_inline __u64 current_cgroup_id(bool btf)
{
	if (btf)
		return nn_btf_task_cgroup_id(bpf_get_current_task_btf(), v1_cpu_cgroup);
	return nn_task_cgroup_id((struct task_struct *)bpf_get_current_task(), v1_cpu_cgroup);
}

static __always_inline unsigned int current_flags(bool btf)
{
	if (btf)
		return bpf_get_current_task_btf()->flags;
	return BPF_CORE_READ((struct task_struct *)bpf_get_current_task(), flags);
}

static __always_inline void on_raise(__u32 vec, bool btf)
{
	struct softirq_pending *p;
	__u64 id;

	if (vec >= NN_NR_SOFTIRQS)
		return;
	p = bpf_map_lookup_elem(&pending, &vec);
	if (!p || p->raise_ns)
		return; /* already pending: the oldest raise is the one that waits longest */
	p->raise_ns = bpf_ktime_get_ns();
	if (!stall_threshold_ns)
		return;
	if (btf) {
		/* One helper call instead of two (the raise is the hottest of the three programs). */
		struct task_struct *t = bpf_get_current_task_btf();

		p->raise_task = (__u64)t;
		p->raise_pid = t->pid;
		p->raise_tgid = t->tgid;
		return;
	}
	id = bpf_get_current_pid_tgid();
	p->raise_pid = (__u32)id;
	p->raise_tgid = id >> 32;
	p->raise_task = bpf_get_current_task();
}

static __always_inline void on_entry(__u32 vec)
{
	struct softirq_pending *p;
	struct softirq_stats *s;
	__u64 now, raised;

	if (vec >= NN_NR_SOFTIRQS)
		return;
	now = bpf_ktime_get_ns();
	s = cpu_stats(vec);
	if (s)
		s->entries++;
	p = bpf_map_lookup_elem(&pending, &vec);
	if (!p)
		return;
	raised = p->raise_ns;
	if (raised > now)
		raised = 0;
	if (stall_threshold_ns && raised) {
		p->run_raise_pid = p->raise_pid;
		p->run_raise_tgid = p->raise_tgid;
		p->run_raise_task = p->raise_task;
	}
	p->raise_ns = 0;
	p->run_raise_ns = raised;
	p->entry_ns = now;
	if (s && raised)
		nn_hist_add(&s->delay, now - raised);
}

static __always_inline void on_exit(__u32 vec, bool btf)
{
	struct softirq_stall_event *e;
	struct softirq_pending *p;
	struct softirq_stats *s;
	__u64 now, entered, runtime, delay;
	__u64 id;

	if (vec >= NN_NR_SOFTIRQS)
		return;
	p = bpf_map_lookup_elem(&pending, &vec);
	if (!p || !p->entry_ns)
		return; /* attached while this run was in progress */
	now = bpf_ktime_get_ns();
	entered = p->entry_ns;
	p->entry_ns = 0;
	if (now < entered)
		return;
	runtime = now - entered;
	s = cpu_stats(vec);
	if (s)
		nn_hist_add(&s->runtime, runtime);

	if (!stall_threshold_ns)
		return;
	delay = p->run_raise_ns ? entered - p->run_raise_ns : 0;
	if (delay < stall_threshold_ns && runtime < stall_threshold_ns)
		return;
	e = bpf_ringbuf_reserve(&stalls, sizeof(*e), 0);
	if (!e) {
		count_drop(NN_DROP_RINGBUF_FULL);
		return;
	}
	id = bpf_get_current_pid_tgid();
	e->ts_ns = now;
	e->delay_ns = delay;
	e->runtime_ns = runtime;
	e->cpu = bpf_get_smp_processor_id();
	e->vec = vec;
	e->entry_pid = (__u32)id;
	e->entry_tgid = id >> 32;
	e->entry_cgroup_id = current_cgroup_id(btf);
	bpf_get_current_comm(e->entry_comm, sizeof(e->entry_comm));
	e->in_ksoftirqd = in_ksoftirqd(current_flags(btf), e->entry_comm);
	e->raise_seen = p->run_raise_ns != 0;
	__builtin_memset(e->_pad, 0, sizeof(e->_pad));
	e->raise_cgroup_id = 0;
	if (e->raise_seen) {
		e->raise_pid = p->run_raise_pid;
		e->raise_tgid = p->run_raise_tgid;
		if (nn_saved_task_comm(p->run_raise_task, p->run_raise_pid, e->raise_comm))
			e->raise_cgroup_id = nn_task_cgroup_id((struct task_struct *)p->run_raise_task, v1_cpu_cgroup);
	} else {
		e->raise_pid = 0;
		e->raise_tgid = 0;
		__builtin_memset(e->raise_comm, 0, NN_COMM_LEN);
	}
	bpf_ringbuf_submit(e, 0);
}

/* ---- tp_btf: BTF-typed tracepoints ----------------------------------------------------------- */

SEC("tp_btf/softirq_raise")
int BPF_PROG(softirq_raise_btf, unsigned int vec_nr)
{
	on_raise(vec_nr, true);
	return 0;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(softirq_entry_btf, unsigned int vec_nr)
{
	on_entry(vec_nr);
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(softirq_exit_btf, unsigned int vec_nr)
{
	on_exit(vec_nr, true);
	return 0;
}

/* ---- raw_tp fallback: same untyped arguments ------------------------------------------------- */

SEC("raw_tp/softirq_raise")
int BPF_PROG(softirq_raise_raw, unsigned int vec_nr)
{
	on_raise(vec_nr, false);
	return 0;
}

SEC("raw_tp/softirq_entry")
int BPF_PROG(softirq_entry_raw, unsigned int vec_nr)
{
	on_entry(vec_nr);
	return 0;
}

SEC("raw_tp/softirq_exit")
int BPF_PROG(softirq_exit_raw, unsigned int vec_nr)
{
	on_exit(vec_nr, false);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
