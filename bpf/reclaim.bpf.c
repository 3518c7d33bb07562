// SPDX-License-Identifier: GPL-2.0
/*
 * Memory reclaim stalls per memory cgroup: how often, how long and how many pages a task spent in
 * reclaim because its cgroup hit its limit (memcg reclaim) or the node ran short (direct reclaim).
 *
 * vmscan:mm_vmscan_{direct,memcg,memcg_softlimit}_reclaim_begin (order, gfp_flags) → ..._end
 * (nr_reclaimed). All of them fire synchronously in the reclaiming task, so `current` is the task
 * that stalls and its memcg is the right key — unlike runqlat there is no other task to look up.
 * On v1/hybrid hosts the key is the v1 memory hierarchy's cgroup (rodata v1_memory_cgroup).
 * Caveats kept as they are, documented in probes/reclaim.py: softlimit reclaim nests inside direct
 * reclaim (and also runs in kswapd); memcg reclaim is also run by whoever writes a smaller limit or
 * memory.reclaim, and is then charged to the writer's memcg; khugepaged reclaims a pod's memcg when the
 * huge page it collapses for that pod is charged at its limit, and is keyed to its own (root) cgroup.
 *
 * Hot path: the begin time lives in task local storage; the raw_tp fallback keeps it in a bounded
 * hash by pid (sized to one entry by the loader in tp_btf mode). Aggregation, per memcg and per
 * node, goes to shared maps with atomic adds: reclaim passes are rare (each one takes far longer
 * than the adds), and a per-CPU value would cost its size times the *possible* CPUs for every key.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "nn_common.h"
#include "reclaim.h"

#define MAX_KEYS 1536 /* (memcg, kind) pairs, e.g. 750 pods' cgroups in direct and memcg reclaim */
#define MAX_FALLBACK_TASKS 16384 /* raw_tp only: tasks in reclaim at once */

/* Set by the loader before load. */
const volatile bool v1_memory_cgroup = false; /* key by the v1 memory controller's cgroup */
const volatile __u64 stall_threshold_ns = 0;  /* 0: no stall events */

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct reclaim_begin);
} task_reclaim SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FALLBACK_TASKS);
	__type(key, __u32);
	__type(value, struct reclaim_begin);
} fallback_reclaim SEC(".maps");

/* Per (memcg id, kind): latency, pages (one copy, atomic adds). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_KEYS);
	__type(key, struct reclaim_key);
	__type(value, struct reclaim_stats);
} cgroup_reclaim SEC(".maps");

/* Per kind, the whole node: index NN_RECLAIM_DIRECT is global direct reclaim (≙ allocstall_*). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NN_RECLAIM_KINDS);
	__type(key, __u32);
	__type(value, struct reclaim_stats);
} node_reclaim SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} stalls SEC(".maps");

/* Only a ring buffer record, so not in the object's BTF: its size is pinned here and in the test. */
_Static_assert(sizeof(struct reclaim_event) == 72, "probes/reclaim.py _ReclaimEvent mirrors this layout");

static const struct reclaim_stats zero_stats;
static const struct reclaim_begin zero_begin;

/* ---- begin state: task storage (tp_btf) or pid hash (raw_tp) --------------------------------- */

static __always_inline void begin_storage(__u32 kind, int order, gfp_t gfp)
{
	struct task_struct *t = bpf_get_current_task_btf();
	struct reclaim_begin *b;

	b = bpf_task_storage_get(&task_reclaim, t, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!b) {
		count_drop(NN_DROP_TASK_STORAGE);
		return;
	}
	if (kind >= NN_RECLAIM_KINDS)
		return;
	b->begin_ns[kind] = bpf_ktime_get_ns();
	b->order[kind] = order;
	b->gfp_flags[kind] = gfp;
}

/* The begin state of `kind` for the current task, cleared; begin_ns 0 if none (attached mid-pass). */
static __always_inline __u64 take_storage(__u32 kind, __u32 *order, __u32 *gfp)
{
	struct task_struct *t = bpf_get_current_task_btf();
	struct reclaim_begin *b = bpf_task_storage_get(&task_reclaim, t, 0, 0);
	__u64 ts;

	if (!b || kind >= NN_RECLAIM_KINDS)
		return 0;
	ts = b->begin_ns[kind];
	*order = b->order[kind];
	*gfp = b->gfp_flags[kind];
	b->begin_ns[kind] = 0;
	return ts;
}

static __always_inline void begin_hash(__u32 kind, int order, gfp_t gfp)
{
	__u32 pid = (__u32)bpf_get_current_pid_tgid();
	struct reclaim_begin *b;

	if (kind >= NN_RECLAIM_KINDS)
		return;
	b = bpf_map_lookup_elem(&fallback_reclaim, &pid);
	if (!b) {
		bpf_map_update_elem(&fallback_reclaim, &pid, &zero_begin, BPF_NOEXIST);
		b = bpf_map_lookup_elem(&fallback_reclaim, &pid);
		if (!b) {
			count_drop(NN_DROP_START_MAP_FULL);
			return;
		}
	}
	b->begin_ns[kind] = bpf_ktime_get_ns();
	b->order[kind] = order;
	b->gfp_flags[kind] = gfp;
}

static __always_inline __u64 take_hash(__u32 kind, __u32 *order, __u32 *gfp)
{
	__u32 pid = (__u32)bpf_get_current_pid_tgid();
	struct reclaim_begin *b = bpf_map_lookup_elem(&fallback_reclaim, &pid);
	__u64 ts;
	int i;

	if (!b || kind >= NN_RECLAIM_KINDS)
		return 0;
	ts = b->begin_ns[kind];
	*order = b->order[kind];
	*gfp = b->gfp_flags[kind];
	b->begin_ns[kind] = 0;
	/* Outermost pass over: free the slot (a nested softlimit pass keeps it for direct's end). */
	for (i = 0; i < NN_RECLAIM_KINDS; i++)
		if (b->begin_ns[i])
			return ts;
	bpf_map_delete_elem(&fallback_reclaim, &pid);
	return ts;
}

/* ---- aggregation ----------------------------------------------------------------------------- */

/* Every CPU adds to the same copy. */
static __always_inline void add_stats(struct reclaim_stats *s, __u64 duration_ns, __u64 nr_reclaimed)
{
	nn_hist_add_shared(&s->latency, duration_ns);
	__sync_fetch_and_add(&s->nr_reclaimed, nr_reclaimed);
	if (!nr_reclaimed)
		__sync_fetch_and_add(&s->no_progress, 1);
}

static __always_inline void account(struct task_struct *t, __u32 kind, __u64 begin_ns, __u32 order,
				    __u32 gfp, __u64 nr_reclaimed)
{
	__u64 now = bpf_ktime_get_ns();
	struct reclaim_key key = {};
	struct reclaim_stats *s;
	__u64 duration_ns;

	if (!begin_ns || now < begin_ns)
		return;
	duration_ns = now - begin_ns;
	key.cgroup_id = nn_task_memcg_id(t, v1_memory_cgroup);
	key.kind = kind;

	s = bpf_map_lookup_elem(&cgroup_reclaim, &key);
	if (!s) {
		bpf_map_update_elem(&cgroup_reclaim, &key, &zero_stats, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&cgroup_reclaim, &key);
	}
	if (s)
		add_stats(s, duration_ns, nr_reclaimed);
	else
		count_drop(NN_DROP_KEY_MAP_FULL);

	s = bpf_map_lookup_elem(&node_reclaim, &kind);
	if (s)
		add_stats(s, duration_ns, nr_reclaimed);

	if (stall_threshold_ns && duration_ns >= stall_threshold_ns) {
		struct reclaim_event *e = bpf_ringbuf_reserve(&stalls, sizeof(*e), 0);

		if (!e) {
			count_drop(NN_DROP_RINGBUF_FULL);
			return;
		}
		e->ts_ns = now;
		e->duration_ns = duration_ns;
		e->cgroup_id = key.cgroup_id;
		e->nr_reclaimed = nr_reclaimed;
		e->pid = BPF_CORE_READ(t, pid);
		e->tgid = BPF_CORE_READ(t, tgid);
		e->kind = kind;
		e->order = order;
		e->gfp_flags = gfp;
		e->cpu = bpf_get_smp_processor_id();
		BPF_CORE_READ_STR_INTO(&e->comm, t, comm);
		bpf_ringbuf_submit(e, 0);
	}
}

static __always_inline void end_btf(__u32 kind, __u64 nr_reclaimed)
{
	__u32 order = 0, gfp = 0;
	__u64 begin_ns = take_storage(kind, &order, &gfp);

	if (begin_ns)
		account(bpf_get_current_task_btf(), kind, begin_ns, order, gfp, nr_reclaimed);
}

static __always_inline void end_raw(__u32 kind, __u64 nr_reclaimed)
{
	__u32 order = 0, gfp = 0;
	__u64 begin_ns = take_hash(kind, &order, &gfp);

	if (begin_ns)
		account((struct task_struct *)bpf_get_current_task(), kind, begin_ns, order, gfp, nr_reclaimed);
}

/* ---- tp_btf: BTF-typed tracepoints, task storage --------------------------------------------- */

SEC("tp_btf/mm_vmscan_direct_reclaim_begin")
int BPF_PROG(reclaim_direct_begin_btf, int order, gfp_t gfp_flags)
{
	begin_storage(NN_RECLAIM_DIRECT, order, gfp_flags);
	return 0;
}

SEC("tp_btf/mm_vmscan_direct_reclaim_end")
int BPF_PROG(reclaim_direct_end_btf, unsigned long nr_reclaimed)
{
	end_btf(NN_RECLAIM_DIRECT, nr_reclaimed);
	return 0;
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_begin")
int BPF_PROG(reclaim_memcg_begin_btf, int order, gfp_t gfp_flags)
{
	begin_storage(NN_RECLAIM_MEMCG, order, gfp_flags);
	return 0;
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_end")
int BPF_PROG(reclaim_memcg_end_btf, unsigned long nr_reclaimed)
{
	end_btf(NN_RECLAIM_MEMCG, nr_reclaimed);
	return 0;
}

SEC("tp_btf/mm_vmscan_memcg_softlimit_reclaim_begin")
int BPF_PROG(reclaim_softlimit_begin_btf, int order, gfp_t gfp_flags)
{
	begin_storage(NN_RECLAIM_SOFTLIMIT, order, gfp_flags);
	return 0;
}

SEC("tp_btf/mm_vmscan_memcg_softlimit_reclaim_end")
int BPF_PROG(reclaim_softlimit_end_btf, unsigned long nr_reclaimed)
{
	end_btf(NN_RECLAIM_SOFTLIMIT, nr_reclaimed);
	return 0;
}

/* ---- raw_tp fallback: untyped arguments, pid hash -------------------------------------------- */

SEC("raw_tp/mm_vmscan_direct_reclaim_begin")
int BPF_PROG(reclaim_direct_begin_raw, int order, gfp_t gfp_flags)
{
	begin_hash(NN_RECLAIM_DIRECT, order, gfp_flags);
	return 0;
}

SEC("raw_tp/mm_vmscan_direct_reclaim_end")
int BPF_PROG(reclaim_direct_end_raw, unsigned long nr_reclaimed)
{
	end_raw(NN_RECLAIM_DIRECT, nr_reclaimed);
	return 0;
}

SEC("raw_tp/mm_vmscan_memcg_reclaim_begin")
int BPF_PROG(reclaim_memcg_begin_raw, int order, gfp_t gfp_flags)
{
	begin_hash(NN_RECLAIM_MEMCG, order, gfp_flags);
	return 0;
}

SEC("raw_tp/mm_vmscan_memcg_reclaim_end")
int BPF_PROG(reclaim_memcg_end_raw, unsigned long nr_reclaimed)
{
	end_raw(NN_RECLAIM_MEMCG, nr_reclaimed);
	return 0;
}

SEC("raw_tp/mm_vmscan_memcg_softlimit_reclaim_begin")
int BPF_PROG(reclaim_softlimit_begin_raw, int order, gfp_t gfp_flags)
{
	begin_hash(NN_RECLAIM_SOFTLIMIT, order, gfp_flags);
	return 0;
}

SEC("raw_tp/mm_vmscan_memcg_softlimit_reclaim_end")
int BPF_PROG(reclaim_softlimit_end_raw, unsigned long nr_reclaimed)
{
	end_raw(NN_RECLAIM_SOFTLIMIT, nr_reclaimed);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
