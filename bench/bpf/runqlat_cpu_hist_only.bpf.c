// SPDX-License-Identifier: GPL-2.0
/*
 * Bench-only variant of bpf/runqlat.bpf.c: the sched_info flavour's sched_switch program keeps only
 * this CPU's wait histogram (no cgroup, no attribution, no migrated waits), to measure the least a
 * wait probe on sched_switch does, so the bench can split what the full program costs above the
 * empty-program floor. Never shipped: bench/variant_objects.py builds it (`make bench-bpf`) and loads
 * it in place of runqlat.bpf.o.
 *
 * The shipped source is included whole so the maps and every other program are the real ones; its
 * sched_info program is renamed (the loader attaches programs by name and leaves others unloaded)
 * and this one takes its name. It reads the tracepoint's BTF arguments from ctx directly: BPF_PROG
 * would declare ____runqlat_switch_schedinfo a second time.
 */
#define runqlat_switch_schedinfo runqlat_switch_schedinfo_shipped
#include "runqlat.bpf.c"
#undef runqlat_switch_schedinfo

SEC("tp_btf/sched_switch")
int runqlat_switch_schedinfo(unsigned long long *ctx)
{
	struct task_struct *prev = (struct task_struct *)ctx[1];
	struct task_struct *next = (struct task_struct *)ctx[2];
	__u32 zero = 0;
	struct runq_cpu_state *cpu = bpf_map_lookup_elem(&runq_cpu, &zero);
	struct nn_hist *h;
	__u64 now, queued, pending = 0;

	if (!cpu)
		return 0;
	if (next->pid) {
		queued = next->sched_info.last_queued;
		if (queued) {
			now = prev->se.cfs_rq->rq->clock;
			pending = now > queued ? now - queued : 0;
		}
		h = cpu_hist(cpu);
		if (h)
			nn_hist_add(h, pending);
	}
	return 0;
}
