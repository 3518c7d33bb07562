// SPDX-License-Identifier: GPL-2.0
/*
 * TCP active opens per (cgroup, network namespace): connect latency, outcomes, SYN retransmits,
 * and the slowest destinations.
 *
 * Start: sock:inet_sock_set_state CLOSE → SYN_SENT, which runs inside connect() in the connecting
 * task's context: the task's pid, address and cgroup and the socket's netns are stored, keyed by the
 * socket's address (the source port may still be 0 then). The store is a direct-mapped table of
 * one-cache-line slots indexed by a hash of that address and claimed by compare-and-swap: no lock,
 * no allocation, and the slab hands a freed socket's address to the next socket, so a connect loop
 * keeps using the same few slots, in cache. A socket whose slot another in-flight connect holds
 * goes to an overflow hash. (The hash alone cost ~400 ns more per connect, kernel-measured; socket
 * local storage, with an allocation per socket and a free at every socket's destruction, measured
 * ~2x the hash.) The task's comm is only read for an outlier event. End: SYN_SENT → ESTABLISHED
 * (usually in softirq, where `current` is unrelated: only the stored data is used) or → CLOSE (a
 * failure; sk_err tells refused/timeout from an application that closed the socket, and an unchanged
 * segs_out tells a connect that never sent its SYN, e.g. no free ephemeral port). Every socket leaves
 * SYN_SENT through this tracepoint (tcp_set_state / inet_sk_set_state), so the end always removes
 * the start (a passive open's SYN_RECV → ESTABLISHED is told from a simultaneous open's without a
 * lookup: its child socket has no struct socket until accept()); the loader attaches
 * tcp:tcp_destroy_sock as a second cleanup only for raw_tp, and userspace sweeps entries older than
 * any connect can last (probes/tcpconnect.py). On tp_btf that saves a program run on every socket
 * destroyed. tcp:tcp_retransmit_skb on a socket in SYN_SENT counts a SYN retransmit.
 *
 * Hot path: inet_sock_set_state fires on every TCP state change and tcp_retransmit_skb on every
 * retransmit; both leave before any map access unless the transition / state is a connect's.
 * Aggregation goes to shared maps with atomic adds: a connect is a rare event next to a context
 * switch, and a per-CPU value would cost its size times the *possible* CPUs for every key (the
 * per-(cgroup, netns) tables were 16 MiB each at 192 possible CPUs, capped, and held 260 keys). The tp_btf programs read socket and task fields with direct BTF
 * loads (a bpf_probe_read_kernel() call per hop is ~20 ns, and a connect reads a dozen fields); the
 * raw_tp fallback, whose pointers are untyped, uses BPF_CORE_READ. The bodies take a constant `btf`
 * flag and are always inlined, so each program keeps only its own kind of reads.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "nn_common.h"
#include "tcpconnect.h"

/*
 * Sizes (the loader may set the hashes'). Every hash here is preallocated: its inserts run in
 * softirq or under a socket lock, and raw_tp programs on kernels before 6.1 may not use a
 * run-time-allocated hash without a kernel warning. So they are sized for what a node holds:
 * 8192 slots + 8192 overflow connects in flight at once, 1024 + 1024 (cgroup, netns) keys (a 250-pod
 * node has ~750 cgroups: ~220 of them find their bucket taken), 1024 + 2048 destinations (LRU: the
 * least recently used make room).
 */
#define MAX_INFLIGHT 8192
#define INFLIGHT_SLOT_BITS 13 /* 8192 slots of 64 bytes */
#define MAX_KEYS 1024
#define CONNECT_BUCKETS 1024  /* direct-mapped (cgroup, netns) buckets, see bucket_of() */
#define DEST_BUCKETS 1024     /* and (cgroup, netns, destination) ones */
#define GOLDEN64 0x9E3779B97F4A7C15ULL
#define MAX_DESTS 2048

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif
#ifndef IPPROTO_TCP
#define IPPROTO_TCP 6
#endif
#define NN_ETIMEDOUT 110
#define NN_ECONNREFUSED 111

/* The ring buffer record is absent from the object's BTF: pin the layout probes/tcpconnect.py mirrors. */
_Static_assert(sizeof(struct tcpconnect_event) == 104, "tcpconnect_event layout changed: update probes/tcpconnect.py");
_Static_assert(sizeof(struct tcpconnect_start) == 48, "tcpconnect_start layout changed");
_Static_assert(sizeof(struct tcpconnect_slot) == 64, "a slot is one cache line");
_Static_assert(sizeof(struct tcpconnect_key) == 16 && sizeof(struct tcpconnect_dest_key) == 32,
	       "bucket_of() reads keys as u64 words: cgroup id, then the netns word");

/* Set by the loader before load. */
const volatile bool v1_cpu_cgroup = false;     /* key by the v1 cpu controller's cgroup */
const volatile __u64 outlier_threshold_ns = 0; /* 0: no outlier events; else slow connects and all failures */

/* Connects in progress: the slots (see the top comment), and the overflow hash by socket address. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << INFLIGHT_SLOT_BITS);
	__type(key, __u32);
	__type(value, struct tcpconnect_slot);
} inflight_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_INFLIGHT);
	__type(key, __u64);
	__type(value, struct tcpconnect_start);
} inflight SEC(".maps");

/*
 * Per (cgroup, netns): latency distribution and outcome counters (shared, atomic adds). Two
 * places, merged by userspace: direct-mapped buckets (a bucket belongs to one key: its owner in
 * connect_bucket_owner, claimed by compare-and-swap, released by userspace when the cgroup is
 * forgotten, after zeroing its counters), and a hash for keys whose bucket another key owns. A bucket costs two inlined array indexes where the hash lookup cost ~200 ns a connect,
 * kernel-measured (bucket array, element and value on three lines the connect path had evicted).
 * The destinations below work the same way, with the LRU hash behind their buckets.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CONNECT_BUCKETS);
	__type(key, __u32);
	__type(value, struct tcpconnect_key);
} connect_bucket_owner SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CONNECT_BUCKETS);
	__type(key, __u32);
	__type(value, struct tcpconnect_stats);
} connect_buckets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_KEYS);
	__type(key, struct tcpconnect_key);
	__type(value, struct tcpconnect_stats);
} connect_stats SEC(".maps");

/*
 * Per (cgroup, netns, destination): count, latency sum and max. LRU: a node talks to an unbounded
 * set of destinations over its life; the least recently used one makes room (userspace sees its
 * counters restart and treats that as a new entry). Destinations that own a bucket (the first to
 * take each; kept until their cgroup is forgotten) never reach the LRU hash.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, DEST_BUCKETS);
	__type(key, __u32);
	__type(value, struct tcpconnect_dest_key);
} dest_bucket_owner SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, DEST_BUCKETS);
	__type(key, __u32);
	__type(value, struct tcpconnect_dest_stats);
} dest_buckets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_DESTS);
	__type(key, struct tcpconnect_dest_key);
	__type(value, struct tcpconnect_dest_stats);
} dest_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} outliers SEC(".maps");

static const struct tcpconnect_stats zero_stats;
static const struct tcpconnect_dest_stats zero_dest;

/* ---- socket fields: direct BTF loads (btf) or probe reads (raw_tp) ---------------------------- */

static __always_inline bool is_tcp(const struct sock *sk, bool btf)
{
	if (btf)
		return BPF_CORE_READ_BITFIELD(sk, sk_protocol) == IPPROTO_TCP;
	return BPF_CORE_READ_BITFIELD_PROBED(sk, sk_protocol) == IPPROTO_TCP;
}

static __always_inline __u32 sk_netns(const struct sock *sk, bool btf)
{
	if (btf)
		return sk->__sk_common.skc_net.net->ns.inum;
	return BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
}

/* segs_out of a TCP socket; tp_btf goes through bpf_skc_to_tcp_sock() (a checked cast the verifier
 * accepts), 0 if the socket is not a full TCP socket. */
static __always_inline __u32 sk_segs_out(const struct sock *sk, bool btf)
{
	if (btf) {
		struct tcp_sock *tp = bpf_skc_to_tcp_sock((void *)sk);

		return tp ? tp->segs_out : 0;
	}
	return BPF_CORE_READ((struct tcp_sock *)sk, segs_out);
}

static __always_inline __u16 sk_family(const struct sock *sk, bool btf)
{
	if (btf)
		return sk->__sk_common.skc_family;
	return BPF_CORE_READ(sk, __sk_common.skc_family);
}

static __always_inline int sk_error(const struct sock *sk, bool btf)
{
	if (btf)
		return sk->sk_err;
	return BPF_CORE_READ(sk, sk_err);
}

/* A passive open's child socket has no struct socket until accept(); a connecting one has one. */
static __always_inline bool sk_has_socket(const struct sock *sk, bool btf)
{
	if (btf)
		return sk->sk_socket != NULL;
	return BPF_CORE_READ(sk, sk_socket) != NULL;
}

static __always_inline __u8 sk_state(const struct sock *sk, bool btf)
{
	if (btf)
		return sk->__sk_common.skc_state;
	return BPF_CORE_READ(sk, __sk_common.skc_state);
}

/* Addresses and ports of the socket; v4 addresses in the first 4 bytes, the rest zero. */
static __always_inline void sk_addrs(const struct sock *sk, __u16 family, __u8 *saddr, __u8 *daddr,
				     __u16 *sport, __u16 *dport, bool btf)
{
	__u16 inet_sport, num, dport_be;

	if (btf) {
		struct tcp_sock *tp = bpf_skc_to_tcp_sock((void *)sk);

		if (family == AF_INET6) {
			__builtin_memcpy(saddr, &sk->__sk_common.skc_v6_rcv_saddr, 16);
			__builtin_memcpy(daddr, &sk->__sk_common.skc_v6_daddr, 16);
		} else {
			__builtin_memcpy(saddr, &sk->__sk_common.skc_rcv_saddr, 4);
			__builtin_memcpy(daddr, &sk->__sk_common.skc_daddr, 4);
		}
		inet_sport = tp ? tp->inet_conn.icsk_inet.inet_sport : 0;
		num = sk->__sk_common.skc_num;
		dport_be = sk->__sk_common.skc_dport;
	} else {
		if (family == AF_INET6) {
			bpf_core_read(saddr, 16, &sk->__sk_common.skc_v6_rcv_saddr);
			bpf_core_read(daddr, 16, &sk->__sk_common.skc_v6_daddr);
		} else {
			bpf_core_read(saddr, 4, &sk->__sk_common.skc_rcv_saddr);
			bpf_core_read(daddr, 4, &sk->__sk_common.skc_daddr);
		}
		inet_sport = BPF_CORE_READ((struct inet_sock *)sk, inet_sport);
		num = BPF_CORE_READ(sk, __sk_common.skc_num);
		dport_be = BPF_CORE_READ(sk, __sk_common.skc_dport);
	}
	/* inet_sport, not skc_num: a socket going to CLOSE has already given its port back (num = 0). */
	*sport = bpf_ntohs(inet_sport);
	if (!*sport)
		*sport = num;
	*dport = bpf_ntohs(dport_be);
}


/* ---- the in-flight table -------------------------------------------------------------------- */

/*
 * The socket's address as a plain number. A tp_btf argument is a trusted pointer, on which the
 * verifier allows no arithmetic (the slot index hashes it) and which no atomic may store: one
 * 8-byte probe read of a stack copy turns it into a scalar. raw_tp arguments are scalars already.
 */
static __always_inline __u64 sock_addr(const struct sock *sk, bool btf)
{
	__u64 ptr = (__u64)sk, addr = 0;

	if (!btf)
		return ptr;
	bpf_probe_read_kernel(&addr, sizeof(addr), &ptr);
	return addr;
}

static __always_inline struct tcpconnect_slot *slot_of(__u64 skp)
{
	/* Fibonacci hashing: socket addresses share their low bits (slab object alignment). */
	__u32 idx = (__u32)((skp * GOLDEN64) >> (64 - INFLIGHT_SLOT_BITS));

	return bpf_map_lookup_elem(&inflight_slots, &idx);
}

static __always_inline void inflight_put(__u64 skp, const struct tcpconnect_start *s)
{
	struct tcpconnect_slot *slot = slot_of(skp);

	if (slot) {
		/* Held by this very socket: an earlier connect of it whose end was never seen (stale). */
		__u64 holder = __sync_val_compare_and_swap(&slot->sk, 0, skp);

		if (!holder || holder == skp) {
			slot->start = *s;
			return;
		}
	}
	/* BPF_ANY: a socket that failed to connect may connect again; the old start is stale. */
	if (bpf_map_update_elem(&inflight, &skp, s, BPF_ANY))
		count_drop(NN_DROP_START_MAP_FULL);
}

/* The start of the socket's connect, and the slot holding it (NULL: it is in the overflow hash). */
static __always_inline struct tcpconnect_start *inflight_get(__u64 skp, struct tcpconnect_slot **slotp)
{
	struct tcpconnect_slot *slot = slot_of(skp);

	if (slot && slot->sk == skp) {
		*slotp = slot;
		return &slot->start;
	}
	*slotp = NULL;
	return bpf_map_lookup_elem(&inflight, &skp);
}

static __always_inline void inflight_remove(__u64 skp, struct tcpconnect_slot *slot)
{
	if (!slot) {
		bpf_map_delete_elem(&inflight, &skp);
		return;
	}
	/* ts 0 = being filled, for the userspace sweep. The release is an atomic (a full barrier): every
	 * read of the start above completes before another connect can claim the slot, on any arch. */
	slot->start.ts_ns = 0;
	__sync_val_compare_and_swap(&slot->sk, skp, 0);
}

/* ---- start: CLOSE → SYN_SENT, inside connect() ------------------------------------------------ */

static __always_inline void connect_start(const struct sock *sk, bool btf)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	struct tcpconnect_start s = {};

	s.ts_ns = bpf_ktime_get_ns();
	if (btf) {
		struct task_struct *t = bpf_get_current_task_btf();

		s.task = (__u64)t;
		s.cgroup_id = nn_btf_task_cgroup_id(t, v1_cpu_cgroup);
	} else {
		s.task = bpf_get_current_task();
		s.cgroup_id = nn_task_cgroup_id((struct task_struct *)s.task, v1_cpu_cgroup);
	}
	s.netns = sk_netns(sk, btf);
	s.pid = pid_tgid >> 32;
	s.tid = (__u32)pid_tgid;
	s.segs_out = sk_segs_out(sk, btf);
	inflight_put(sock_addr(sk, btf), &s);
}

/* ---- end: SYN_SENT (or SYN_RECV, simultaneous open) → ESTABLISHED / CLOSE --------------------- */

/*
 * The bucket a key owns, claiming it if free; -1 if another key owns it (the caller uses its hash).
 * `key` is `words` u64s: a cgroup id (never 0; 0 marks a free owner) first, then a word holding the
 * netns (never 0). A free owner is claimed by compare-and-swap of the cgroup word; the other words
 * follow, the second last by an atomic exchange (ordered after the rest on any arch), so a
 * half-written owner matches no key and its users take the hash meanwhile.
 */
static __always_inline int bucket_of(void *owners, const __u64 *key, int words, __u32 buckets)
{
	__u64 h = 0, *owner;
	__u32 idx;
	int i;

	for (i = 0; i < words; i++)
		h = (h ^ key[i]) * GOLDEN64;
	idx = (__u32)(h >> 32) & (buckets - 1);
	owner = bpf_map_lookup_elem(owners, &idx);
	if (!owner)
		return -1;
	if (!owner[0] && !__sync_val_compare_and_swap(&owner[0], 0, key[0])) {
		for (i = 2; i < words; i++)
			owner[i] = key[i];
		__sync_lock_test_and_set(&owner[1], key[1]);
	}
	for (i = 0; i < words; i++)
		if (owner[i] != key[i])
			return -1;
	return idx;
}

static __always_inline struct tcpconnect_stats *stats_for(struct tcpconnect_key *key)
{
	int idx = bucket_of(&connect_bucket_owner, (const __u64 *)key, sizeof(*key) / 8, CONNECT_BUCKETS);
	struct tcpconnect_stats *st;

	if (idx >= 0) {
		st = bpf_map_lookup_elem(&connect_buckets, &idx);
		if (st)
			return st;
	}
	st = bpf_map_lookup_elem(&connect_stats, key);
	if (st)
		return st;
	bpf_map_update_elem(&connect_stats, key, &zero_stats, BPF_NOEXIST);
	st = bpf_map_lookup_elem(&connect_stats, key);
	if (!st)
		count_drop(NN_DROP_KEY_MAP_FULL);
	return st;
}

static __always_inline void connect_end(const struct sock *sk, int newstate, bool btf)
{
	__u64 skp = sock_addr(sk, btf);
	struct tcpconnect_slot *slot;
	struct tcpconnect_start *s = inflight_get(skp, &slot);
	struct tcpconnect_key key = {};
	struct tcpconnect_dest_key dkey = {};
	struct tcpconnect_dest_stats *ds;
	struct tcpconnect_stats *st;
	__u64 now, latency;
	int bucket;
	__u16 outcome, sport = 0, dport = 0;
	__u8 saddr[16] = {};
	int err = 0;

	if (!s)
		return; /* not a connect we saw start (e.g. began before the probe loaded) */
	now = bpf_ktime_get_ns();
	latency = now > s->ts_ns ? now - s->ts_ns : 0;
	if (newstate == TCP_ESTABLISHED) {
		outcome = TCPC_ESTABLISHED;
	} else {
		err = sk_error(sk, btf);
		if (sk_segs_out(sk, btf) == s->segs_out)
			outcome = TCPC_LOCAL_ERROR;
		else if (err)
			outcome = TCPC_FAILED;
		else
			outcome = TCPC_ABORTED;
	}

	key.cgroup_id = s->cgroup_id;
	key.netns = s->netns;
	st = stats_for(&key);
	if (st) {
		switch (outcome) {
		case TCPC_ESTABLISHED:
			nn_hist_add_shared(&st->latency, latency);
			__sync_fetch_and_add(&st->successes, 1);
			break;
		case TCPC_FAILED:
			__sync_fetch_and_add(&st->failures, 1);
			if (err == NN_ECONNREFUSED)
				__sync_fetch_and_add(&st->refused, 1);
			else if (err == NN_ETIMEDOUT)
				__sync_fetch_and_add(&st->timeouts, 1);
			break;
		case TCPC_ABORTED:
			__sync_fetch_and_add(&st->aborts, 1);
			break;
		default:
			__sync_fetch_and_add(&st->local_errors, 1);
		}
	}

	dkey.cgroup_id = s->cgroup_id;
	dkey.netns = s->netns;
	dkey.family = sk_family(sk, btf);
	sk_addrs(sk, dkey.family, saddr, dkey.daddr, &sport, &dport, btf);
	dkey.dport = dport;
	bucket = bucket_of(&dest_bucket_owner, (const __u64 *)&dkey, sizeof(dkey) / 8, DEST_BUCKETS);
	ds = bucket >= 0 ? bpf_map_lookup_elem(&dest_buckets, &bucket) : NULL;
	if (!ds)
		ds = bpf_map_lookup_elem(&dest_stats, &dkey);
	if (!ds) {
		bpf_map_update_elem(&dest_stats, &dkey, &zero_dest, BPF_NOEXIST);
		ds = bpf_map_lookup_elem(&dest_stats, &dkey);
	}
	if (ds) {
		if (outcome == TCPC_ESTABLISHED) {
			__sync_fetch_and_add(&ds->count, 1);
			__sync_fetch_and_add(&ds->sum_ns, latency);
			/* Racy compare-and-store, as nn_hist_add_shared()'s max. */
			if (latency > ds->max_ns)
				ds->max_ns = latency;
		} else {
			__sync_fetch_and_add(&ds->failures, 1);
		}
	} else {
		count_drop(NN_DROP_KEY_MAP_FULL);
	}

	if (outlier_threshold_ns && (outcome != TCPC_ESTABLISHED || latency >= outlier_threshold_ns)) {
		struct tcpconnect_event *e = bpf_ringbuf_reserve(&outliers, sizeof(*e), 0);

		if (!e) {
			count_drop(NN_DROP_RINGBUF_FULL);
		} else {
			e->ts_ns = now;
			e->latency_ns = latency;
			e->cgroup_id = s->cgroup_id;
			e->netns = s->netns;
			e->pid = s->pid;
			e->tid = s->tid;
			e->family = dkey.family;
			e->outcome = outcome;
			e->error = err;
			e->syn_retrans = s->syn_retrans;
			e->sport = sport;
			e->dport = dport;
			e->__pad = 0;
			__builtin_memcpy(e->saddr, saddr, sizeof(e->saddr));
			__builtin_memcpy(e->daddr, dkey.daddr, sizeof(e->daddr));
			nn_saved_task_comm(s->task, s->tid, e->comm);
			bpf_ringbuf_submit(e, 0);
		}
	}
	inflight_remove(skp, slot);
}

static __always_inline void on_state(const struct sock *sk, int oldstate, int newstate, bool btf)
{
	if (newstate == TCP_SYN_SENT) {
		if (oldstate == TCP_CLOSE && is_tcp(sk, btf))
			connect_start(sk, btf);
		return;
	}
	if ((newstate == TCP_ESTABLISHED || newstate == TCP_CLOSE) &&
	    (oldstate == TCP_SYN_SENT || (oldstate == TCP_SYN_RECV && sk_has_socket(sk, btf))) && is_tcp(sk, btf))
		connect_end(sk, newstate, btf);
}

/* A SYN retransmit: the tracepoint fires for every retransmit, only SYN_SENT sockets matter. */
static __always_inline void on_retransmit(const struct sock *sk, int err, bool btf)
{
	struct tcpconnect_slot *slot;
	struct tcpconnect_start *s;
	struct tcpconnect_key key = {};
	struct tcpconnect_stats *st;

	if (err || sk_state(sk, btf) != TCP_SYN_SENT)
		return;
	s = inflight_get(sock_addr(sk, btf), &slot);
	if (!s)
		return;
	__sync_fetch_and_add(&s->syn_retrans, 1);
	key.cgroup_id = s->cgroup_id;
	key.netns = s->netns;
	st = stats_for(&key);
	if (st)
		__sync_fetch_and_add(&st->syn_retransmits, 1);
}

/*
 * Since 6.13 the tracepoint also fires for retransmits that failed locally, with their error as a
 * third argument; only sent ones count. Older kernels have no such argument: the CO-RE check turns
 * the read into dead code there (the verifier never sees the out-of-range context access).
 */
static __always_inline int retransmit_err(unsigned long long *ctx)
{
	if (bpf_core_field_exists(struct trace_event_raw_tcp_retransmit_skb, err))
		return (int)ctx[2];
	return 0;
}

/* raw_tp only (scalar socket address). */
static __always_inline void on_destroy(const struct sock *sk)
{
	struct tcpconnect_slot *slot;
	__u64 skp = (__u64)sk;

	if (inflight_get(skp, &slot))
		inflight_remove(skp, slot);
}

/* ---- tp_btf: BTF-typed tracepoints --------------------------------------------------------- */

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(tcpconnect_state_btf, const struct sock *sk, int oldstate, int newstate)
{
	on_state(sk, oldstate, newstate, true);
	return 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(tcpconnect_retransmit_btf, const struct sock *sk, const struct sk_buff *skb)
{
	on_retransmit(sk, retransmit_err(ctx), true);
	return 0;
}

/* tp_btf has no destroy program: see the header comment. */

/* ---- raw_tp fallback: untyped arguments ----------------------------------------------------- */

SEC("raw_tp/inet_sock_set_state")
int BPF_PROG(tcpconnect_state_raw, const struct sock *sk, int oldstate, int newstate)
{
	on_state(sk, oldstate, newstate, false);
	return 0;
}

SEC("raw_tp/tcp_retransmit_skb")
int BPF_PROG(tcpconnect_retransmit_raw, const struct sock *sk, const struct sk_buff *skb)
{
	on_retransmit(sk, retransmit_err(ctx), false);
	return 0;
}

SEC("raw_tp/tcp_destroy_sock")
int BPF_PROG(tcpconnect_destroy_raw, struct sock *sk)
{
	on_destroy(sk);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
