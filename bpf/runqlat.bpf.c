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
 *   since the task's previous switch-in (kept per pid in an array) so the wait stays whole.
 * - tp_btf: wakeup/wakeup_new → switch with the start time in task storage (in the pid hash for a
 *   task whose storage cannot be created).
 * - raw_tp (kernels without BTF-typed tracepoints): the same with a bounded pid hash, because raw
 *   task pointers cannot be passed to task storage.
 * Everywhere, aggregation goes to per-CPU maps: no event writes a map all CPUs contend on.
 *
 * Who ran instead (sched_info flavour only): each CPU remembers its last RUNQ_RING_SLOTS slices
 * {start on the rq clock, cgroup of the task that ran} in a per-CPU ring written at every switch
 * (consecutive slices of one cgroup share a slot).
 * When `next` switches in after waiting [last_queued, now], the ring is walked backwards and the
 * overlap of each slice is charged: to the victim's own cgroup, to idle, or to the foreign cgroup
 * in the victim x culprit matrix (runq_culprits); what the ring does not reach is "unknown", what
 * was waited on another CPU before a migration is "migrated". Own/idle/unknown/migrated and the
 * foreign total live in the victim's cgroup_runq value that is updated anyway, so a switch between
 * tasks of one cgroup (perf bench sched pipe) adds no map update. A `prev` switched out while
 * runnable is counted as preempted by next's cgroup (own or foreign; foreign ones per culprit).
 * softirq_entry/exit (same flavour, optional) time each CPU's softirq work, which runs on top of
 * whatever task is there: a wait's part of it is taken out with the kernel work (runqlat.h).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "nn_common.h"
#include "runqlat.h"

#define MAX_CGROUPS 16384       /* the loader sizes the cgroup and pair tables (map_sizes) before load */
#define MAX_CULPRIT_PAIRS 8192
#define MAX_FALLBACK_TASKS 65536
#define RUN_DELAY_TAG_SHIFT 58  /* task_run_delay: the pid's high bits above, run_delay + 1 below */
#define RUN_DELAY_SEEN_MASK ((1ULL << RUN_DELAY_TAG_SHIFT) - 1)

/* Set by the loader before load. */
const volatile bool v1_cpu_cgroup = false;     /* key by the v1 cpu controller's cgroup */
const volatile __u64 outlier_threshold_ns = 0; /* 0: no outlier events */
const volatile __u32 pid_slots = 0;            /* entries of task_run_delay: a power of 2 */
const volatile __u32 pid_slot_bits = 0;        /* log2(pid_slots): a pid's bits above it are its tag */
/*
 * The statistics tables hold `stripes` copies of each slot (a power of 2, at most the possible CPUs):
 * CPU c writes copy c % stripes. Where every CPU has its own copy (stripes == possible CPUs) the adds
 * are plain, as in a per-CPU map; where CPUs share one (a large node) they are atomic. The branch is
 * on a constant: the verifier keeps one side.
 */
const volatile __u32 stripes = 1;
const volatile bool stripes_shared = false;
const volatile __u32 cgroup_slot_count = MAX_CGROUPS;     /* slots of cgroup_runq (entries / stripes) */
const volatile __u32 pair_slot_count = MAX_CULPRIT_PAIRS; /* slots of runq_culprits and runq_cf */
const volatile __u64 node_cgroup_id = 1;       /* the root cgroup's id (kernel threads): runq_counterfactual.node_slots */
/* Tests: every task of this cgroup counts as kernel work (their stand-in for kswapd); 0 in the agent. */
const volatile __u64 test_kernel_work_cgroup_id = 0;

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct task_wait);
} task_wait SEC(".maps");

/*
 * sched_info flavour: each task's sched_info.run_delay after its last switch-in, plus one (0: not
 * seen since load), at pid % pid_slots, tagged with the pid's bits above (RUN_DELAY_TAG_SHIFT). An
 * inlined array index where a task-storage get cost ~35 ns per switch. The loader sizes it to the pid
 * space up to 2^16 slots (512 KiB), whatever pid_max is: two live pids on one slot take it in turn, and
 * a wait whose entry another pid holds has no migrated part (only a queued task the load balancer
 * moved has one).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1); /* the loader sets it (map_sizes) */
	__type(key, __u32);
	__type(value, __u64);
} task_run_delay SEC(".maps");

/*
 * Start times by pid: all of them in the raw_tp flavour; in the tp_btf flavour those of tasks whose
 * storage could not be created (a create is refused while another storage call is in progress on
 * this CPU, e.g. an interrupt's wakeup nested in ours, and its atomic allocation may fail), so their
 * wait is not lost. `fallback_entries` counts what the hash holds: tp_btf switches look in it
 * only while it holds something.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_FALLBACK_TASKS);
	__type(key, __u32);
	__type(value, __u64);
} fallback_queued_ns SEC(".maps");

__u64 fallback_entries = 0;

/*
 * Per cgroup: the wait distribution, and (sched_info flavour) the wait split by who ran meanwhile
 * and the preemptions (userspace sums a slot's stripes). The statistics sit in a shared array,
 * one slot of `stripes` copies per cgroup: `cgroup_slots` says which slot, and each CPU caches the
 * index of its copy (runq_cpu_state slot_cache), so a switch costs an inlined array index where a
 * per-CPU hash lookup cost ~60 ns. Memory is slots x stripes x value, whatever the CPU count (a
 * per-CPU array at 192 CPUs held 254 cgroups in 16 MiB). New cgroups take a slot freed before (a
 * stack userspace pushes to when it forgets a removed cgroup, after zeroing the slot's copies), else
 * the next never-used one.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_CGROUPS);
	__type(key, __u64);
	__type(value, __u32);
} cgroup_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK);
	__uint(max_entries, MAX_CGROUPS);
	__uint(value_size, sizeof(__u32));
} free_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE); /* userspace reads it in place: no copy of the idle slots */
	__uint(max_entries, MAX_CGROUPS);  /* slots x stripes: slot k's copies are k * stripes + 0 .. stripes - 1 */
	__type(key, __u32);
	__type(value, struct runq_cgroup_stats);
} cgroup_runq SEC(".maps");

__u64 slots_taken = 0; /* never-used slots handed out so far (the next one is this) */

/*
 * Victim x culprit: foreign wait and preemptions per pair (sched_info flavour), in slots like the
 * cgroups' (a pair index, a stack of freed slots, a counter of never-used ones, a per-CPU cache):
 * while a best-effort pod keeps an LS pod waiting, every switch between them charges a pair.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_CULPRIT_PAIRS);
	__type(key, struct runq_culprit_key);
	__type(value, __u32);
} culprit_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK);
	__uint(max_entries, MAX_CULPRIT_PAIRS);
	__uint(value_size, sizeof(__u32));
} free_culprit_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, MAX_CULPRIT_PAIRS); /* slots x stripes, as cgroup_runq */
	__type(key, __u32);
	__type(value, struct runq_culprit_stats);
} runq_culprits SEC(".maps");

__u64 culprit_slots_taken = 0; /* never-used pair slots handed out so far */

/*
 * The pair slots handed to a new pair, in the order taken: the reader looks at a pair's slot only when
 * its victim's cgroup slot moved (every charge of a pair is made with a change to its victim's own
 * statistics) or when it is here, so an idle pod's pairs cost it nothing a tick. As many entries as
 * pair slots: a slot is taken once until userspace frees it again, after emptying this queue.
 */
struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, MAX_CULPRIT_PAIRS);
	__uint(value_size, sizeof(__u32));
} new_culprit_slots SEC(".maps");

/*
 * Zero at run time, unknown to the verifier (.bss is writable, so its loads are not constants): the
 * ring walk's culprit accumulators start from it. Started from literal zeros, a verifier that checks a
 * bpf_loop() callback as if it ran once (6.1 does; "verify callbacks as if they are called unknown
 * number of times" came in 6.7) proves the second culprit always 0 and removes its charge as dead
 * code: in the VM lane on 6.1 a third to a half of the foreign wait of two alternating culprits
 * reached no pair, with no drop counted.
 */
__u64 walk_zero = 0;

/*
 * Per pair slot (as runq_culprits): the victim's histogram moves without the culprit. Shared by every
 * CPU (atomic adds), not per-CPU: 256 bytes a pair whatever the CPU count, and it is written only for a
 * wait the culprit lengthened enough to change its log2 slot, so CPUs meet on a line only while the
 * same pair interferes on several of them at the same moment.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE); /* read (the pairs that moved) and zeroed (a freed slot) in place */
	__uint(max_entries, MAX_CULPRIT_PAIRS);
	__type(key, __u32);
	__type(value, struct runq_counterfactual);
} runq_cf SEC(".maps");

/* Per CPU: the current slice and the ring of the last finished ones. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct runq_cpu_state);
} runq_cpu SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1); /* the loader sets it: the possible CPUs */
	__type(key, __u32);
	__type(value, struct runq_cpu_hist);
} runq_cpu_hist SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} outliers SEC(".maps");

_Static_assert(sizeof(struct runq_cpu_hist) % 64 == 0, "a CPU's histogram is whole cache lines");

/* This CPU's histogram (runq_cpu_hist); its number is looked up once and kept in its state. */
static __always_inline struct nn_hist *cpu_hist(struct runq_cpu_state *cpu)
{
	struct runq_cpu_hist *h;
	__u32 i = cpu->cpu_plus_one;

	if (!i) {
		i = bpf_get_smp_processor_id() + 1;
		cpu->cpu_plus_one = i;
	}
	i--;
	h = bpf_map_lookup_elem(&runq_cpu_hist, &i);
	return h ? &h->hist : NULL;
}


/* ---- start-time storage: task storage (tp_btf) or pid hash (raw_tp) ---------------------- */

/* Keep a start in the pid hash; false when the hash is full (or busy on this CPU). */
static __always_inline bool mark_queued_hash(__u32 pid, __u64 now, bool overwrite)
{
	__u64 *t = bpf_map_lookup_elem(&fallback_queued_ns, &pid);

	if (t) {
		if (overwrite || !*t)
			*t = now;
		return true;
	}
	if (bpf_map_update_elem(&fallback_queued_ns, &pid, &now, BPF_NOEXIST))
		return false;
	__sync_fetch_and_add(&fallback_entries, 1);
	return true;
}

static __always_inline void drop_queued_hash(__u32 pid)
{
	if (!bpf_map_delete_elem(&fallback_queued_ns, &pid))
		__sync_fetch_and_add(&fallback_entries, -1);
}

static __always_inline __u64 take_queued_hash(__u32 pid)
{
	__u64 *t = bpf_map_lookup_elem(&fallback_queued_ns, &pid);
	__u64 v;

	if (!t)
		return 0;
	v = *t;
	drop_queued_hash(pid);
	return v;
}

static __always_inline struct task_wait *task_wait_of(struct task_struct *p, __u64 flags)
{
	return bpf_task_storage_get(&task_wait, p, 0, flags);
}

static __always_inline void mark_queued_storage(struct task_struct *p, __u64 now, bool overwrite)
{
	struct task_wait *w = task_wait_of(p, BPF_LOCAL_STORAGE_GET_F_CREATE);

	if (!w) {
		/* No storage and none could be created: the pid hash keeps it; lost only if that fails too. */
		if (!mark_queued_hash(p->pid, now, overwrite))
			count_drop(NN_DROP_TASK_STORAGE);
		return;
	}
	/* A wakeup of a task that is already queued (ttwu on a runnable task) keeps the older time. */
	if (overwrite || !w->queued_ns)
		w->queued_ns = now;
}

static __always_inline void clear_queued_storage(struct task_struct *p)
{
	struct task_wait *w = task_wait_of(p, 0);

	if (w)
		w->queued_ns = 0;
	if (fallback_entries)
		drop_queued_hash(p->pid); /* a stale start must not outlive the sleep there either */
}

/*
 * The start of next's wait, from its storage or (while the hash holds any) from the pid hash, which
 * is emptied for the task either way: of two starts (a create refused at a wakeup, the storage
 * created at a later one while still queued) the older is the wait's, as for a repeated wakeup.
 */
static __always_inline __u64 take_queued_storage(struct task_struct *p)
{
	struct task_wait *w = task_wait_of(p, 0);
	__u64 t = 0, hashed;

	if (w) {
		t = w->queued_ns;
		w->queued_ns = 0;
	}
	if (fallback_entries) {
		hashed = take_queued_hash(p->pid);
		if (hashed && (!t || hashed < t))
			t = hashed;
	}
	return t;
}

/* ---- aggregation ----------------------------------------------------------------------------- */

/* Add to a statistic in a striped table: plain where this CPU has its copy alone, atomic where CPUs share one. */
static __always_inline void stat_add(__u64 *p, __u64 v)
{
	if (stripes_shared) {
		if (v)
			__sync_fetch_and_add(p, v);
	} else {
		*p += v;
	}
}

static __always_inline void stat_hist_add(struct nn_hist *h, __u32 slot, __u64 value_ns)
{
	if (stripes_shared)
		nn_hist_add_shared_at(h, slot, value_ns);
	else
		nn_hist_add_at(h, slot, value_ns);
}

/* This CPU's copy of `slot` in a striped table (cgroup_runq, runq_culprits). */
static __always_inline __u32 stripe_index(__u32 slot)
{
	return slot * stripes + (bpf_get_smp_processor_id() & (stripes - 1));
}

/*
 * A key's slot in a slotted table of `slot_count` slots: from `index`, else a freed slot from
 * `free_stack`, else the next never-used one (`taken`), indexed with BPF_NOEXIST: when another CPU
 * indexed the key first, its slot wins and ours goes back. -1 when every slot is taken or the index
 * is full. Always inlined: the verifier sees each caller's own maps.
 */
static __always_inline int slot_of(void *index, void *free_stack, __u64 *taken, __u32 slot_count, const void *key,
				   __u32 *slot, void *taken_queue)
{
	__u32 *found = bpf_map_lookup_elem(index, key);
	__u64 next;

	if (found) {
		*slot = *found;
		return 0;
	}
	if (bpf_map_pop_elem(free_stack, slot)) {
		/*
		 * A plain read first: once the table is full, every switch-in of a cgroup without a slot
		 * would otherwise bounce this shared line between CPUs with an atomic add.
		 */
		if (*taken >= slot_count)
			return -1;
		next = __sync_fetch_and_add(taken, 1);
		if (next >= slot_count)
			return -1;
		*slot = next;
	}
	if (*slot >= slot_count)
		return -1;
	if (bpf_map_update_elem(index, key, slot, BPF_NOEXIST)) {
		bpf_map_push_elem(free_stack, slot, 0);
		found = bpf_map_lookup_elem(index, key);
		if (!found)
			return -1;
		*slot = *found;
		return 0;
	}
	if (taken_queue)
		bpf_map_push_elem(taken_queue, slot, 0);
	return 0;
}

/*
 * The cgroup's slot from the index, taking a free one for a new cgroup, and remembered in this CPU's
 * cache. A full index or no free slot loses the update, counted.
 */
static __noinline struct runq_cgroup_stats *cgroup_stats_slow(struct runq_cpu_state *cpu, __u64 cgid)
{
	struct runq_slot_cache_entry *e;
	struct runq_cgroup_stats *s;
	__u32 slot;

	if (!cpu || !cgid)
		return NULL;
	if (slot_of(&cgroup_slots, &free_slots, &slots_taken, cgroup_slot_count, &cgid, &slot, NULL)) {
		count_drop(NN_DROP_KEY_MAP_FULL); /* the cgroups' share of it: key_map_full less culprit_drops */
		return NULL;
	}
	slot = stripe_index(slot);
	s = bpf_map_lookup_elem(&cgroup_runq, &slot);
	if (!s) {
		count_drop(NN_DROP_KEY_MAP_FULL);
		return NULL;
	}
	/* First use of this copy of the slot: userspace zeroed every copy before freeing it. */
	if (s->cgroup_id != cgid)
		s->cgroup_id = cgid;
	e = &cpu->slot_cache[cgid & (RUNQ_SLOT_CACHE - 1)];
	e->cgroup_id = cgid;
	e->slot = slot; /* the index of this CPU's copy */
	return s;
}

/*
 * This CPU's statistics of cgroup `cgid`. The slot's own cgroup_id is checked, so a slot that was
 * freed (zeroed) and handed to another cgroup is never written for the old one from a stale cache.
 */
static __always_inline struct runq_cgroup_stats *cgroup_stats(struct runq_cpu_state *cpu, __u64 cgid)
{
	struct runq_slot_cache_entry *e = &cpu->slot_cache[cgid & (RUNQ_SLOT_CACHE - 1)];
	struct runq_cgroup_stats *s;
	__u32 slot;

	if (e->cgroup_id == cgid && cgid) {
		slot = e->slot;
		s = bpf_map_lookup_elem(&cgroup_runq, &slot);
		if (s && s->cgroup_id == cgid)
			return s;
	}
	return cgroup_stats_slow(cpu, cgid);
}

#define PREV_CGID_UNREAD (~0ULL) /* report_outlier(): read prev's cgroup only if the event needs it */

/* A wait above the outlier threshold goes to the ring buffer, with who ran right before it. */
static __always_inline void report_outlier(struct task_struct *prev, struct task_struct *next,
					   __u64 cgid, __u64 prev_cgid, __u64 wait_ns)
{
	if (outlier_threshold_ns && wait_ns >= outlier_threshold_ns) {
		struct runq_event *e = bpf_ringbuf_reserve(&outliers, sizeof(*e), 0);

		if (!e) {
			count_drop(NN_DROP_RINGBUF_FULL);
			return;
		}
		e->ts_ns = bpf_ktime_get_ns();
		e->wait_ns = wait_ns;
		e->cgroup_id = cgid;
		e->prev_cgroup_id = prev_cgid != PREV_CGID_UNREAD ? prev_cgid : nn_task_cgroup_id(prev, v1_cpu_cgroup);
		e->pid = BPF_CORE_READ(next, pid);
		e->tgid = BPF_CORE_READ(next, tgid);
		e->prev_pid = BPF_CORE_READ(prev, pid);
		e->cpu = bpf_get_smp_processor_id();
		BPF_CORE_READ_STR_INTO(&e->comm, next, comm);
		BPF_CORE_READ_STR_INTO(&e->prev_comm, prev, comm);
		bpf_ringbuf_submit(e, 0);
	}
}

static __always_inline void account_cgroup(struct task_struct *prev, struct task_struct *next,
					   __u64 cgid, __u64 wait_ns)
{
	__u32 zero = 0;
	struct runq_cpu_state *cpu = bpf_map_lookup_elem(&runq_cpu, &zero);
	struct runq_cgroup_stats *s;
	struct nn_hist *h;
	__u32 slot;

	if (!cpu)
		return;
	s = cgroup_stats(cpu, cgid);
	/* Both histograms at once: the slot is computed once, and is dead for the verifier after. */
	slot = nn_hist_slot(wait_ns);
	h = cpu_hist(cpu);
	if (h)
		nn_hist_add_at(h, slot, wait_ns);
	if (s)
		stat_hist_add(&s->hist, slot, wait_ns);
	report_outlier(prev, next, cgid, PREV_CGID_UNREAD, wait_ns);
}

static __always_inline void account(struct task_struct *prev, struct task_struct *next, __u64 wait_ns)
{
	account_cgroup(prev, next, nn_task_cgroup_id(next, v1_cpu_cgroup), wait_ns);
}


/* ---- sched_info: the kernel's own enqueue stamps, one program -------------------------------- */

/* task_struct.__state through a BTF pointer: a plain load, where nn_task_state() is a helper call. */
static __always_inline unsigned int task_state_btf(struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return t->__state;
	return ((struct task_struct___pre_5_14 *)t)->state;
}

static __always_inline struct runq_pair_cache_entry *pair_cache_entry(struct runq_cpu_state *cpu, __u64 victim,
								      __u64 culprit)
{
	return &cpu->pair_cache[(victim + culprit * 31) & (RUNQ_PAIR_CACHE - 1)];
}

/* The pair's slot from the index, taking a free one for a new pair, remembered in this CPU's cache. */
static __noinline struct runq_culprit_stats *culprit_stats_slow(struct runq_cpu_state *cpu, __u64 victim,
								__u64 culprit, __u32 *slot_out)
{
	struct runq_culprit_key key = { .victim_cgroup_id = victim, .culprit_cgroup_id = culprit };
	struct runq_pair_cache_entry *e;
	struct runq_culprit_stats *c;
	__u32 slot;

	if (!cpu || !victim)
		return NULL;
	if (slot_of(&culprit_slots, &free_culprit_slots, &culprit_slots_taken, pair_slot_count, &key, &slot,
		    &new_culprit_slots))
		return NULL; /* counted by the caller */
	/* One stack slot for the pair's slot and then its copy's index: 6.1 adds up the walk's frames. */
	*slot_out = slot;
	slot = stripe_index(slot);
	c = bpf_map_lookup_elem(&runq_culprits, &slot);
	if (!c)
		return NULL;
	/* First use of this copy of the slot: userspace zeroed every copy before freeing it. */
	if (c->pair.victim_cgroup_id != victim || c->pair.culprit_cgroup_id != culprit)
		c->pair = key;
	e = pair_cache_entry(cpu, victim, culprit);
	e->pair = key;
	e->slot = *slot_out | (__u64)slot << 32; /* the pair's slot (runq_cf), and this CPU's copy of it */
	return c;
}

/*
 * Move one wait of the pair from histogram slot `from` to slot `to`. Global functions (this and the
 * next): the verifier checks each once, not once per path of each caller (two log2s inlined into every
 * charge made the switch program too complex to load).
 */
/*
 * Kernel work a workload causes and the node's kernel threads do for it: memory management for the
 * allocations that drained the node's free memory (kswapd reclaiming; kcompactd, which kswapd wakes to
 * compact what it freed; kdamond, DAMON's thread, whose reclaim schemes page out the cold pages a grower
 * streamed through), ksoftirqd running the softirq work that overflowed interrupt exit (a sender's
 * packets). Their slices are marked in the ring; a wait's part behind them is what
 * runq_counterfactual.node_slots takes out. Other kernel threads (rcu, kworkers), and on a v1 host every
 * process outside a pod (the root cpu cgroup holds them all), are the node but not this work.
 */
/* include/linux/sched.h (macros: not in BTF); the same values in 5.x and 6.x (Debian 12's 6.1 headers, 6.18). */
#define PF_KTHREAD_FLAG 0x00200000 /* PF_KTHREAD */
#define PF_KSWAPD_FLAG 0x00020000  /* PF_KSWAPD */
/* comm[0..7] read as a little-endian u64 */
#define KSOFTIRQ_COMM8 0x71726974666f736bULL /* "ksoftirq" (ksoftirqd/N) */
#define KCOMPACT_COMM8 0x746361706d6f636bULL /* "kcompact" (kcompactdN) */
#define KDAMOND_COMM8 0x2e646e6f6d61646bULL  /* "kdamond." (kdamond.N) */

static __always_inline bool kernel_work_task(struct task_struct *t)
{
	__u32 flags = t->flags;
	__u64 comm8;

	if (!(flags & PF_KTHREAD_FLAG))
		return false;
	if (flags & PF_KSWAPD_FLAG)
		return true;
	/* comm[0..7] in one BTF-typed load (a scalar array may be read at any width inside it). */
	comm8 = *(__u64 *)t->comm;
	if (comm8 == KDAMOND_COMM8)
		return true;
	return (comm8 == KSOFTIRQ_COMM8 || comm8 == KCOMPACT_COMM8) && t->comm[8] == 'd';
}

/* One wait leaves histogram slot `from` for `to` in `slots` (a pair's slots or node_slots). */
static __always_inline void move_slot(__s64 *slots, __u32 from, __u32 to)
{
	if (from < NN_HIST_SLOTS)
		__sync_fetch_and_add(&slots[from], -1);
	if (to < NN_HIST_SLOTS)
		__sync_fetch_and_add(&slots[to], 1);
}

__noinline int move_counterfactual_slots(__u32 pair_slot, __u32 from, __u32 to)
{
	struct runq_counterfactual *cf;

	if (from == to)
		return 0;
	cf = bpf_map_lookup_elem(&runq_cf, &pair_slot);
	if (cf)
		move_slot(cf->slots, from, to);
	return 0;
}

/*
 * The counterfactual move of a wait of `full_ns` (in slot `full_slot`; 0: not known) without the
 * culprit's `part_ns`. The common case, the culprit ran for all of it (woken during its slice), moves
 * it to slot 0 with no log2 on the hot path; the others compute both slots in a global function.
 */
__noinline int move_counterfactual_ns(__u32 pair_slot, __u64 full_ns, __u64 part_ns)
{
	return move_counterfactual_slots(pair_slot, nn_hist_slot(full_ns),
					 nn_hist_slot(full_ns > part_ns ? full_ns - part_ns : 0));
}

/*
 * The kernel work in a wait (`node_ns`: kernel_work_task()'s slices), taken out after the culprit's
 * `part_ns` of `full_ns`: from slot(full - part) to slot(full - part - node), in the pair's node_slots.
 * On the node's own pair the kernel work alone is taken out of the whole wait: slot(full) to
 * slot(full - node), for a culprit that never ran on the victim's CPU (a grower kswapd reclaims for,
 * a sender whose packets ksoftirqd processes). The pair's slot is looked up again here (it was just
 * charged: a pair the matrix lost has no slot and no move) instead of widening charge_culprit(), which
 * the walk's callback inlines: one more branch there took the switch program past the verifier's limit.
 */
__noinline int move_counterfactual_node(__u64 victim, __u64 culprit, __u64 full_ns, __u64 part_ns, __u64 node_ns)
{
	struct runq_culprit_key key = { .victim_cgroup_id = victim, .culprit_cgroup_id = culprit };
	struct runq_counterfactual *cf;
	__u64 rest;
	__u32 *slot, from, to;

	if (culprit == node_cgroup_id)
		part_ns = 0; /* the node's own pair: the kernel work alone, out of the whole wait */
	else if (!part_ns)
		return 0;
	if (!node_ns || full_ns < RUNQ_CF_MIN_NS)
		return 0;
	rest = full_ns > part_ns ? full_ns - part_ns : 0;
	slot = bpf_map_lookup_elem(&culprit_slots, &key);
	if (!slot)
		return 0;
	cf = bpf_map_lookup_elem(&runq_cf, slot);
	if (!cf)
		return 0;
	__sync_fetch_and_add(&cf->node_ns, node_ns);
	from = nn_hist_slot(rest);
	to = nn_hist_slot(rest > node_ns ? rest - node_ns : 0);
	if (from != to)
		move_slot(cf->node_slots, from, to);
	return 0;
}

static __always_inline void move_counterfactual(__u32 pair_slot, __u64 full_ns, __u64 part_ns, __u32 full_slot)
{
	if (full_slot && part_ns + 1000 > full_ns) /* under 1 µs left: slot 0 */
		move_counterfactual_slots(pair_slot, full_slot, 0);
	else
		move_counterfactual_ns(pair_slot, full_ns, part_ns);
}

/*
 * Add to the victim x culprit matrix; a full matrix loses the update, counted. `full_ns`: the whole
 * wait `wait_ns` is part of (0: a preemption, no wait), for the counterfactual.
 */
static __always_inline void charge_culprit(struct runq_cpu_state *cpu, __u64 victim, __u64 culprit,
					   __u64 wait_ns, __u64 turns, __u64 preemptions, __u64 full_ns, __u32 full_slot)
{
	struct runq_pair_cache_entry *e = pair_cache_entry(cpu, victim, culprit);
	struct runq_culprit_stats *c = NULL;
	__u32 slot = 0;

	if (e->pair.victim_cgroup_id == victim && e->pair.culprit_cgroup_id == culprit && victim) {
		slot = e->slot >> 32; /* this CPU's copy, then the pair's slot (one stack slot: see culprit_stats_slow) */
		c = bpf_map_lookup_elem(&runq_culprits, &slot);
		if (c && (c->pair.victim_cgroup_id != victim || c->pair.culprit_cgroup_id != culprit))
			c = NULL;
		slot = (__u32)e->slot;
	}
	if (!c)
		c = culprit_stats_slow(cpu, victim, culprit, &slot);
	if (!c) {
		count_drop(NN_DROP_KEY_MAP_FULL);
		cpu->culprit_drops++;
		cpu->culprit_drop_ns += wait_ns;
		return;
	}
	stat_add(&c->wait_ns, wait_ns);
	stat_add(&c->count, turns);
	stat_add(&c->preemptions, preemptions);
	if (wait_ns && full_ns >= RUNQ_CF_MIN_NS)
		move_counterfactual(slot, full_ns, wait_ns, full_slot);
}

/*
 * This CPU's softirq_ns at ktime `t`, known to be `floor_ns` at `floor_t` (the start of the slice `t` is
 * in, from the ring). Exact when `t` falls within the last RUNQ_SOFTIRQ_MARKS runs of softirq work or
 * after them. Before them (a slice with many short runs: a sender's loopback traffic runs NET_RX at
 * every send), the work between the slice's start and the oldest remembered run is taken as spread
 * evenly over that time. Global functions (this and the next two), each with its own lookup of the
 * CPU's state: the verifier checks each once, not on every path of the switch program (which a static
 * one taking `cpu` took past the verifier's limit).
 */
__noinline __u64 softirq_ns_at(__u64 t, __u64 floor_t, __u64 floor_ns)
{
	__u32 zero = 0, i;
	struct runq_cpu_state *cpu = bpf_map_lookup_elem(&runq_cpu, &zero);
	__u64 at, at_t = 0, part, span;

	if (!cpu)
		return floor_ns;
	at = cpu->softirq_ns;
	for (i = 0; i < RUNQ_SOFTIRQ_MARKS; i++) {
		struct runq_softirq_mark *m = &cpu->marks[(cpu->mark_head - 1 - i) & (RUNQ_SOFTIRQ_MARKS - 1)];

		if (!m->exit)
			break; /* never written */
		if (m->exit <= t)
			return m->total > floor_ns ? m->total : floor_ns;
		if (m->entry <= t) {
			/* Inside a run: its work taken as spread evenly over it (one vector: all of it). */
			span = (m->exit - m->entry) >> 6;
			part = ((m->total - m->before) >> 6) * ((t - m->entry) >> 6);
			return span ? m->before + (part / span << 6) : m->before;
		}
		at = m->before;
		at_t = m->entry;
	}
	if (!at_t || at <= floor_ns || t <= floor_t || at_t <= t)
		return at > floor_ns && t > floor_t ? at : floor_ns;
	/* In 64 ns units: the product stays in 64 bits for slices up to a minute. */
	part = ((at - floor_ns) >> 6) * ((t - floor_t) >> 6);
	span = (at_t - floor_t) >> 6;
	return span ? floor_ns + (part / span << 6) : floor_ns;
}

/*
 * Softirq work's `softirq_ns` of a wait of `full_ns` out with the kernel work's `node_ns`, on the node's
 * own pair. A pair no node task ran in this wait (after the idle task, say) is `charge`d one turn and no
 * wait first: the softirq work is the interrupted task's in the split, the turn the kernel's, and it
 * changes the pair's value, which is how userspace knows to read its moves.
 */
__noinline int move_counterfactual_softirq(__u64 victim, __u64 full_ns, __u64 node_ns, __u64 softirq_ns, __u64 charge)
{
	__u32 zero = 0;
	struct runq_cpu_state *cpu = bpf_map_lookup_elem(&runq_cpu, &zero);

	if (!cpu)
		return 0;
	if (charge)
		charge_culprit(cpu, victim, node_cgroup_id, 0, 1, 0, 0, 0);
	return move_counterfactual_node(victim, node_cgroup_id, full_ns, 0, node_ns + softirq_ns);
}

/*
 * A wait of `pending` ns woken during the slice that just ended, which had softirq work on top of it:
 * that work's part since the wait began (`queued_ktime`) comes out with the node's kernel work. (A
 * culprit's own pair already takes its whole slice out.)
 */
__noinline int softirq_in_wait(__u64 victim, __u64 queued, __u64 pending, __u64 full_ns, __u64 charge)
{
	__u32 zero = 0;
	struct runq_cpu_state *cpu = bpf_map_lookup_elem(&runq_cpu, &zero);
	struct runq_slice *newest;
	__u64 sq, ktime_off;

	if (!cpu)
		return 0;
	/* The rq clock (ring, last_queued) into ktime (marks): their offset at this switch. */
	ktime_off = bpf_ktime_get_ns() - cpu->slice_start;
	newest = &cpu->ring[(cpu->head - 1) & (RUNQ_RING_SLOTS - 1)]; /* the slice the wait began in */
	sq = cpu->softirq_ns - softirq_ns_at(queued + ktime_off, newest->start + ktime_off, newest->softirq_ns);
	if (!sq || (__s64)sq < 0)
		return 0;
	return move_counterfactual_softirq(victim, full_ns, 0, sq < pending ? sq : pending, charge);
}

/* The state of one ring walk (bpf_loop callback context, on the caller's stack). */
struct slice_walk {
	struct runq_cpu_state *cpu;
	__u64 victim, queued;
	__u64 full;           /* the whole wait (with what it waited on another CPU): the counterfactual's */
	__u64 end;            /* where the slice being charged ends: the newer one's start */
	__u64 last_cgroup_id; /* the newer slice's cgroup: a change starts a new turn */
	__u64 own, idle, foreign;
	__u64 node;           /* of `foreign`, the kernel work's (RUNQ_SLICE_KERNEL_WORK slices of node_cgroup_id) */
	/* Two culprits accumulated over the walk: two cgroups taking turns cost two map updates. */
	__u64 c0, n0, t0, c1, n1, t1;
	/*
	 * Softirq work in the wait's slices (those not kernel work already): `softirq`, of which `s0` and
	 * `s1` on top of c0's and c1's. `end_softirq` is the CPU's softirq_ns where the slice being charged
	 * ends; `ktime_off` turns the rq clock into ktime (0: the counterfactual does not move this wait).
	 */
	__u64 softirq, s0, s1, end_softirq, ktime_off;
	/*
	 * No copy of cpu->head (the ring does not move during the walk): 6.1 adds up the frames of the
	 * switch program, this walk, its callback and culprit_stats_slow (each rounded up to 32 bytes)
	 * against 512 bytes, and they come to exactly that: a byte more on any of them refuses the load.
	 */
};

/* Charge the i-th newest finished slice's overlap with the wait. 1 stops the walk. */
static long charge_slice(__u32 i, struct slice_walk *w)
{
	__u32 slot = (w->cpu->head - 1 - i) & (RUNQ_RING_SLOTS - 1);
	__u64 start = w->cpu->ring[slot].start, cg = w->cpu->ring[slot].cgroup_id, lo, ns, turn, kernel_work;
	__u64 sq = 0, from = w->cpu->ring[slot].softirq_ns;

	if (!start || start >= w->end)
		return 1; /* never written (just loaded) or not older: what is left is unknown */
	kernel_work = cg & RUNQ_SLICE_KERNEL_WORK;
	cg &= ~RUNQ_SLICE_KERNEL_WORK;
	lo = start > w->queued ? start : w->queued;
	ns = w->end - lo;
	/* The softirq work in the slice's part of the wait (in a kernel-work slice it is that work already). */
	if (start <= w->queued && w->ktime_off && !kernel_work)
		from = softirq_ns_at(w->queued + w->ktime_off, start + w->ktime_off, from);
	if (!kernel_work && w->ktime_off && w->end_softirq > from) {
		sq = w->end_softirq - from;
		if (sq > ns)
			sq = ns;
		w->softirq += sq;
	}
	w->end_softirq = w->cpu->ring[slot].softirq_ns;
	turn = cg != w->last_cgroup_id;
	w->last_cgroup_id = cg;
	if (cg && cg != w->victim) {
		w->foreign += ns;
		if (kernel_work)
			w->node += ns;
		if (cg == w->c0) {
			w->n0 += ns;
			w->t0 += turn;
			w->s0 += sq;
		} else if (cg == w->c1) {
			w->n1 += ns;
			w->t1 += turn;
			w->s1 += sq;
		} else {
			/* A third culprit: the oldest is charged before the walk knows the node's part. */
			if (w->c1)
				charge_culprit(w->cpu, w->victim, w->c1, w->n1, w->t1, 0, w->full, 0);
			w->c1 = w->c0;
			w->n1 = w->n0;
			w->t1 = w->t0;
			w->s1 = w->s0;
			w->c0 = cg;
			w->n0 = ns;
			w->t0 = 1;
			w->s0 = sq;
		}
	} else if (cg) {
		w->own += ns;
	} else {
		w->idle += ns;
	}
	if (start <= w->queued)
		return 1; /* reached the start of the wait */
	w->end = start;
	return 0;
}

/*
 * Split a wait [queued, now] on this CPU that began before prev's slice, which is already closed
 * into the ring (cpu->slice_start is now): walk the finished slices newest first. Slices are
 * contiguous, so each one is charged up to where the newer one started and the parts add up to
 * exactly the wait when the ring reaches back to `queued`; the rest is unknown. The walk is a
 * bpf_loop(): the verifier checks the body once instead of once per slot. Not inlined, so the
 * common case (attribute_wait) does not even pay for setting up the walk.
 */
static __noinline void attribute_long_wait(struct runq_cpu_state *cpu, struct runq_cgroup_stats *s,
					   __u64 victim, __u64 queued, __u64 full)
{
	struct slice_walk w = {};
	__u64 pending, ns, other;

	if (!cpu || !s)
		return;
	w.c0 = w.c1 = walk_zero;
	w.n0 = w.n1 = walk_zero;
	w.t0 = w.t1 = walk_zero;
	w.s0 = w.s1 = walk_zero;
	w.node = walk_zero;
	w.softirq = walk_zero;
	w.last_cgroup_id = ~walk_zero;
	pending = cpu->slice_start - queued;
	w.cpu = cpu;
	w.victim = victim;
	w.queued = queued;
	w.full = full;
	w.end = cpu->slice_start;
	w.end_softirq = cpu->softirq_ns;
	/* Only for a wait the counterfactual moves, and only if softirq work ran since the ring's oldest slice. */
	if (full >= RUNQ_CF_MIN_NS && cpu->softirq_ns != cpu->ring[cpu->head & (RUNQ_RING_SLOTS - 1)].softirq_ns)
		w.ktime_off = (bpf_ktime_get_ns() - cpu->slice_start) | 1;
	/* Kernels before bpf_loop (5.17): a wait longer than the current slice is all unknown. */
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_loop))
		bpf_loop(RUNQ_RING_SLOTS, charge_slice, &w, 0);
	if (w.c0) {
		charge_culprit(cpu, victim, w.c0, w.n0, w.t0, 0, full, 0);
		other = w.node + w.softirq - w.s0;
		if (other && w.c0 != node_cgroup_id)
			move_counterfactual_node(victim, w.c0, full, w.n0, other);
	}
	if (w.c1) {
		charge_culprit(cpu, victim, w.c1, w.n1, w.t1, 0, full, 0);
		other = w.node + w.softirq - w.s1;
		if (other && w.c1 != node_cgroup_id)
			move_counterfactual_node(victim, w.c1, full, w.n1, other);
	}
	if (w.node || w.softirq)
		move_counterfactual_softirq(victim, full, w.node, w.softirq,
					    w.softirq && w.c0 != node_cgroup_id && w.c1 != node_cgroup_id);
	stat_add(&s->own_wait_ns, w.own);
	stat_add(&s->idle_wait_ns, w.idle);
	stat_add(&s->foreign_wait_ns, w.foreign);
	ns = w.own + w.idle + w.foreign;
	stat_add(&s->unknown_wait_ns, pending > ns ? pending - ns : 0);
}

/*
 * Charge a wait of `pending` ns that ends now to who ran meanwhile. `prev_start` is when prev's
 * slice began; the ring already holds it. `full`: the wait as the histogram has it (pending plus
 * what it waited on another CPU before a migration).
 */
static __always_inline void attribute_wait(struct runq_cpu_state *cpu, struct runq_cgroup_stats *s, __u64 victim,
					   __u64 prev_cg, bool prev_kernel_work, __u64 prev_start, __u64 queued,
					   __u64 pending, __u64 full, __u32 full_slot, bool prev_softirq)
{
	/* The common case, and all of perf's pipe ping-pong: woken during prev's slice. */
	if (prev_start && prev_start <= queued) {
		if (prev_cg == victim)
			stat_add(&s->own_wait_ns, pending);
		else if (!prev_cg)
			stat_add(&s->idle_wait_ns, pending);
		else {
			stat_add(&s->foreign_wait_ns, pending);
			charge_culprit(cpu, victim, prev_cg, pending, 1, 0, full, full_slot);
			if (prev_kernel_work)
				move_counterfactual_node(victim, prev_cg, full, 0, pending);
		}
		/* One compare for the waits the counterfactual does not move (perf's are µs). */
		if (full >= RUNQ_CF_MIN_NS && prev_softirq && !prev_kernel_work)
			softirq_in_wait(victim, queued, pending, full, prev_cg != node_cgroup_id);
		return;
	}
	attribute_long_wait(cpu, s, victim, queued, full);
}

/* `prev` leaves the CPU still runnable for a task of another cgroup (or idle). */
static __always_inline void count_foreign_preemption(struct runq_cpu_state *cpu, __u64 prev_cg, __u64 next_cg)
{
	struct runq_cgroup_stats *s = cgroup_stats(cpu, prev_cg);

	if (s)
		stat_add(&s->foreign_preemptions, 1);
	charge_culprit(cpu, prev_cg, next_cg, 0, 0, 1, 0, 0);
}

/*
 * Softirq work on this CPU (runq_cpu_state.softirq_ns, marks): one vector's entry to its exit; vectors
 * handled back to back extend one run. Entry and exit of one vector run on one CPU with no switch between.
 */
static __always_inline void softirq_edge(bool entry)
{
	__u32 zero = 0;
	struct runq_cpu_state *cpu = bpf_map_lookup_elem(&runq_cpu, &zero);
	struct runq_softirq_mark *m;
	__u64 now, since;

	if (!cpu)
		return;
	now = bpf_ktime_get_ns();
	if (entry) {
		cpu->softirq_entry = now;
		return;
	}
	since = cpu->softirq_entry;
	cpu->softirq_entry = 0;
	if (!since || now <= since)
		return; /* attached between an entry and its exit */
	m = &cpu->marks[(cpu->mark_head - 1) & (RUNQ_SOFTIRQ_MARKS - 1)];
	if (!cpu->mark_head || since > m->exit + RUNQ_SOFTIRQ_RUN_GAP_NS) {
		m = &cpu->marks[cpu->mark_head & (RUNQ_SOFTIRQ_MARKS - 1)];
		m->entry = since;
		m->before = cpu->softirq_ns;
		cpu->mark_head++;
	}
	cpu->softirq_ns += now - since;
	m->exit = now;
	m->total = cpu->softirq_ns;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(runqlat_softirq_entry_btf, unsigned int vec_nr)
{
	softirq_edge(true);
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(runqlat_softirq_exit_btf, unsigned int vec_nr)
{
	softirq_edge(false);
	return 0;
}

/*
 * The wait a task had accounted at a dequeue since it last ran (a queued task the load balancer moved):
 * run_delay's growth since its last switch-in, from its task_run_delay slot, which is then set for
 * this switch-in (`pending` is what sched_info_arrive() is about to add). Inlined (a call cost 13 ns a
 * switch), with the caller's dead lookup key as its own: the switch program's frame is part of the
 * deepest call chain (the ring walk's), which 6.1 adds up against 512 bytes.
 */
static __always_inline __u64 migrated_since_last_run(__u32 *key, __u32 pid, __u64 run_delay, __u64 pending,
						     bool first_arrival)
{
	__u64 *seen, tag, was, migrated = 0;

	*key = pid & (pid_slots - 1);
	seen = bpf_map_lookup_elem(&task_run_delay, key);

	if (!seen)
		return 0;
	tag = (__u64)(pid >> pid_slot_bits) << RUN_DELAY_TAG_SHIFT;
	was = *seen;
	if (first_arrival)
		migrated = run_delay;
	else if ((was & ~RUN_DELAY_SEEN_MASK) == tag && (was & RUN_DELAY_SEEN_MASK) &&
		 run_delay + 1 > (was & RUN_DELAY_SEEN_MASK))
		migrated = run_delay + 1 - (was & RUN_DELAY_SEEN_MASK);
	*seen = tag | ((run_delay + pending + 1) & RUN_DELAY_SEEN_MASK);
	return migrated;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(runqlat_switch_schedinfo, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u32 zero = 0, prev_pid = prev->pid, next_pid = next->pid;
	struct runq_cpu_state *cpu = bpf_map_lookup_elem(&runq_cpu, &zero);
	struct runq_cgroup_stats *s;
	struct nn_hist *h;
	__u64 now, prev_start, queued, run_delay, pending = 0, migrated = 0, prev_cg = 0, next_cg = 0, prev_slice_id;
	__u32 slot;
	bool own_preemption, first_arrival, prev_kernel_work, prev_softirq;

	if (!cpu)
		return 0;
	/*
	 * This CPU's rq clock, as sched_info_arrive() will read it: set_task_rq() points every task's
	 * se.cfs_rq (the idle task's too) at a cfs_rq of its CPU whatever its class, and `prev` runs
	 * here. (The per-CPU `runqueues` symbol would be simpler but needs CONFIG_KALLSYMS_ALL.)
	 */
	now = prev->se.cfs_rq->rq->clock;
	/* prev is the task switched in last time on this CPU: its cgroup is known without a walk. */
	if (prev_pid) {
		if (cpu->cur_pid == prev_pid) {
			prev_cg = cpu->cur_cgroup_id;
		} else {
			prev_cg = nn_btf_task_cgroup_id(prev, v1_cpu_cgroup);
			/* Keep the two loads apart: one load insn may not read both a map value and kernfs. */
			barrier_var(prev_cg);
		}
	}
	if (next_pid)
		next_cg = nn_btf_task_cgroup_id(next, v1_cpu_cgroup);

	/*
	 * Still runnable: preempted (even after setting a sleep state), rescheduled on the way back to
	 * user space (preempt is false then: perf's pipe ping-pong does it at every other switch), or
	 * yielding. The kernel counts these in nivcsw. One of the own cgroup is counted below in next's
	 * value, which is updated anyway: no extra lookup.
	 */
	own_preemption = false;
	if (prev_pid && (preempt || task_state_btf(prev) == TASK_RUNNING)) {
		if (next_pid && next_cg == prev_cg)
			own_preemption = true;
		else
			count_foreign_preemption(cpu, prev_cg, next_cg);
	}

	/*
	 * Close prev's slice into the ring; next's begins. A slice of the same cgroup as the newest
	 * finished one extends it instead (that one ends where the current slice starts), so tasks of
	 * one cgroup taking turns use one slot and the ring reaches further back.
	 */
	prev_start = cpu->slice_start;
	prev_kernel_work = prev_pid && ((prev_cg == node_cgroup_id && kernel_work_task(prev)) ||
					(test_kernel_work_cgroup_id && prev_cg == test_kernel_work_cgroup_id));
	prev_slice_id = prev_cg | (prev_kernel_work ? RUNQ_SLICE_KERNEL_WORK : 0);
	if (prev_start && (!cpu->head || cpu->ring[(cpu->head - 1) & (RUNQ_RING_SLOTS - 1)].cgroup_id != prev_slice_id)) {
		struct runq_slice *slot = &cpu->ring[cpu->head & (RUNQ_RING_SLOTS - 1)];

		slot->start = prev_start;
		slot->cgroup_id = prev_slice_id;
		slot->softirq_ns = cpu->slice_softirq_ns;
		cpu->head++;
	}
	prev_softirq = cpu->softirq_ns != cpu->slice_softirq_ns;
	cpu->slice_softirq_ns = cpu->softirq_ns;
	cpu->slice_start = now;
	cpu->cur_pid = next_pid;
	cpu->cur_cgroup_id = next_cg;

	if (next_pid) {
		/*
		 * No enqueue stamp (preempted after setting a sleep state): the kernel counts the arrival
		 * (pcount) with no wait, and so do we, so event counts stay equal to timeslices.
		 */
		queued = next->sched_info.last_queued;
		if (queued) {
			pending = now - queued;
			if ((__s64)pending < 0)
				pending = 0;
			/*
			 * Wait accounted at a dequeue since it last ran (a queued task was migrated): the
			 * growth of run_delay since its last switch-in, to which sched_info_arrive() is about
			 * to add `pending`. A task's first arrival (pcount 0) has all of its run_delay from
			 * before a migration (fork zeroes sched_info), whatever an earlier owner of its pid
			 * left in the array.
			 */
			run_delay = next->sched_info.run_delay;
			first_arrival = next->sched_info.pcount == 0;
			migrated = migrated_since_last_run(&zero, next_pid, run_delay, pending, first_arrival);
		}
		s = cgroup_stats(cpu, next_cg);
		slot = nn_hist_slot(pending + migrated);
		h = cpu_hist(cpu);
		if (h)
			nn_hist_add_at(h, slot, pending + migrated);
		if (s)
			stat_hist_add(&s->hist, slot, pending + migrated);
		if (s) {
			if (own_preemption)
				stat_add(&s->own_preemptions, 1);
			stat_add(&s->migrated_wait_ns, migrated);
			if (pending)
				attribute_wait(cpu, s, next_cg, prev_cg, prev_kernel_work, prev_start, queued, pending,
					       pending + migrated, slot, prev_softirq);
		}
		report_outlier(prev, next, next_cg, prev_cg, pending + migrated);
	}
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
		account_cgroup(prev, next, nn_btf_task_cgroup_id(next, v1_cpu_cgroup), now - queued);
	return 0;
}

/* ---- raw_tp fallback: untyped arguments, pid hash -------------------------------------------- */

SEC("raw_tp/sched_wakeup")
int BPF_PROG(runqlat_wakeup_raw, struct task_struct *p)
{
	__u32 pid = BPF_CORE_READ(p, pid);

	if (pid && !mark_queued_hash(pid, bpf_ktime_get_ns(), false))
		count_drop(NN_DROP_START_MAP_FULL);
	return 0;
}

SEC("raw_tp/sched_wakeup_new")
int BPF_PROG(runqlat_wakeup_new_raw, struct task_struct *p)
{
	__u32 pid = BPF_CORE_READ(p, pid);

	if (pid && !mark_queued_hash(pid, bpf_ktime_get_ns(), false))
		count_drop(NN_DROP_START_MAP_FULL);
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
		if (preempt || nn_task_state(prev) == TASK_RUNNING) {
			if (!mark_queued_hash(prev_pid, now, true))
				count_drop(NN_DROP_START_MAP_FULL);
		} else {
			drop_queued_hash(prev_pid); /* went to sleep: a stale start must not survive */
		}
	}
	if (!next_pid)
		return 0;
	queued = take_queued_hash(next_pid);
	if (queued && now > queued)
		account(prev, next, now - queued);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
