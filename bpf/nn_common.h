// SPDX-License-Identifier: GPL-2.0
/* Helpers shared by every noisyneighbor BPF program. */
#ifndef NN_COMMON_H
#define NN_COMMON_H

#include "nn_events.h"

#ifndef TASK_RUNNING
#define TASK_RUNNING 0
#endif

/*
 * Why an event was not counted (enum nn_drop_reason), per CPU. Every probe has one; userspace
 * sums the CPUs and exports the totals: losses are never silent.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NN_DROP_REASONS);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

static __always_inline void count_drop(__u32 reason)
{
	__u64 *n = bpf_map_lookup_elem(&drops, &reason);

	if (n)
		(*n)++;
}

/* task_struct.state was renamed __state in 5.14: read whichever this kernel has. */
struct task_struct___pre_5_14 {
	long state;
} __attribute__((preserve_access_index));

static __always_inline unsigned int nn_task_state(struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return BPF_CORE_READ(t, __state);
	return BPF_CORE_READ((struct task_struct___pre_5_14 *)t, state);
}

/*
 * The cgroup a task is charged to. On v2 hosts this is the default-hierarchy cgroup (its id is what
 * bpf_get_current_cgroup_id() returns); on v1/hybrid hosts pods live in the v1 hierarchies, so the
 * loader asks for the v1 cpu controller's cgroup instead. Both ids are kernfs node ids, i.e. the
 * inode numbers of the cgroup directories, which userspace maps back to paths.
 */
/* The v1 cgroup of a task in the hierarchy of controller `subsys_id` (a relocated enum value). */
static __always_inline __u64 nn_task_v1_cgroup_id(struct task_struct *t, int subsys_id)
{
	struct css_set *cset = BPF_CORE_READ(t, cgroups);
	struct cgroup_subsys_state *css = NULL;

	if (subsys_id < 0 || subsys_id >= CGROUP_SUBSYS_COUNT)
		return 0;
	bpf_core_read(&css, sizeof(css), &cset->subsys[subsys_id]);
	return BPF_CORE_READ(css, cgroup, kn, id);
}

static __always_inline __u64 nn_task_cgroup_id(struct task_struct *t, bool v1_cpu)
{
	if (v1_cpu)
		return nn_task_v1_cgroup_id(t, bpf_core_enum_value(enum cgroup_subsys_id, cpu_cgrp_id));
	return BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
}

/* Memory attribution (reclaim): the v1 memory controller's cgroup on v1/hybrid hosts. */
static __always_inline __u64 nn_task_memcg_id(struct task_struct *t, bool v1_memory)
{
	if (v1_memory)
		return nn_task_v1_cgroup_id(t, bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id));
	return BPF_CORE_READ(t, cgroups, dfl_cgrp, kn, id);
}

/*
 * The same ids through direct BTF pointer loads, for tp_btf programs and BTF-typed task pointers
 * (bpf_get_current_task_btf(), tracepoint arguments): the verifier turns these into plain loads with
 * an exception-table fixup, where each BPF_CORE_READ hop above is a bpf_probe_read_kernel() call
 * (~20 ns each). Never call these from raw_tp programs: their pointers are untyped scalars.
 */
static __always_inline __u64 nn_btf_task_v1_cgroup_id(struct task_struct *t, int subsys_id)
{
	if (subsys_id < 0 || subsys_id >= CGROUP_SUBSYS_COUNT)
		return 0;
	return t->cgroups->subsys[subsys_id]->cgroup->kn->id;
}

static __always_inline __u64 nn_btf_task_cgroup_id(struct task_struct *t, bool v1_cpu)
{
	if (v1_cpu)
		return nn_btf_task_v1_cgroup_id(t, bpf_core_enum_value(enum cgroup_subsys_id, cpu_cgrp_id));
	return t->cgroups->dfl_cgrp->kn->id;
}

static __always_inline __u64 nn_btf_task_memcg_id(struct task_struct *t, bool v1_memory)
{
	if (v1_memory)
		return nn_btf_task_v1_cgroup_id(t, bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id));
	return t->cgroups->dfl_cgrp->kn->id;
}

/*
 * A task remembered by address (kept in a map at some earlier event) may have exited and its
 * task_struct been freed and reused since. Probe reads of it are safe either way; only a pid that
 * still matches vouches for the address. Copies its comm into `comm` (NN_COMM_LEN bytes, left empty
 * when the pid no longer matches) and says whether it matched.
 */
static __always_inline bool nn_saved_task_comm(__u64 task_addr, __u32 pid, char *comm)
{
	struct task_struct *t = (struct task_struct *)task_addr;

	__builtin_memset(comm, 0, NN_COMM_LEN);
	if (!task_addr || BPF_CORE_READ(t, pid) != (int)pid)
		return false;
	bpf_probe_read_kernel_str(comm, NN_COMM_LEN, &t->comm);
	return true;
}

/* floor(log2(v)) + 1 for v > 0, 0 for v == 0: slot k holds values in [2^(k-1), 2^k). */
static __always_inline __u32 nn_log2_slot(__u64 v)
{
	__u32 slot = 0;

	if (v >= (1ULL << 32)) { v >>= 32; slot += 32; }
	if (v >= (1ULL << 16)) { v >>= 16; slot += 16; }
	if (v >= (1ULL << 8))  { v >>= 8;  slot += 8; }
	if (v >= (1ULL << 4))  { v >>= 4;  slot += 4; }
	if (v >= (1ULL << 2))  { v >>= 2;  slot += 2; }
	if (v >= (1ULL << 1))  { slot += 1; }
	return v ? slot + 1 : 0;
}

/* The histogram slot of a value (ns): log2 of µs, the last slot holding everything above. */
static __always_inline __u32 nn_hist_slot(__u64 value_ns)
{
	__u32 slot = nn_log2_slot(value_ns / 1000);

	return slot < NN_HIST_SLOTS ? slot : NN_HIST_SLOTS - 1;
}

/* Add a value whose slot is known (one value going into two histograms computes it once). */
static __always_inline void nn_hist_add_at(struct nn_hist *h, __u32 slot, __u64 value_ns)
{
	if (slot >= NN_HIST_SLOTS)
		return;
	h->slots[slot]++;
	h->sum_ns += value_ns;
	h->count++;
	if (value_ns > h->max_ns)
		h->max_ns = value_ns;
}

static __always_inline void nn_hist_add(struct nn_hist *h, __u64 value_ns)
{
	nn_hist_add_at(h, nn_hist_slot(value_ns), value_ns);
}

/*
 * The same into a histogram every CPU writes (a shared map's value, for rare events): atomic adds,
 * so no count is lost. The max is a plain compare-and-store: two CPUs raising it at the same moment
 * may leave the smaller of the two (an atomic max needs a compare-and-swap loop, 5.12+); sum and
 * count stay exact.
 */
static __always_inline void nn_hist_add_shared_at(struct nn_hist *h, __u32 slot, __u64 value_ns)
{
	if (slot >= NN_HIST_SLOTS)
		return;
	__sync_fetch_and_add(&h->slots[slot], 1);
	__sync_fetch_and_add(&h->sum_ns, value_ns);
	__sync_fetch_and_add(&h->count, 1);
	if (value_ns > h->max_ns)
		h->max_ns = value_ns;
}

static __always_inline void nn_hist_add_shared(struct nn_hist *h, __u64 value_ns)
{
	nn_hist_add_shared_at(h, nn_hist_slot(value_ns), value_ns);
}

#endif /* NN_COMMON_H */
