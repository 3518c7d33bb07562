// SPDX-License-Identifier: GPL-2.0
/*
 * Hard IRQ handler time per CPU and IRQ line, from irq:irq_handler_entry / irq_handler_exit.
 *
 * A device's interrupt handler runs on whichever CPU the interrupt lands on, in the time of whatever
 * task was running there: on kernels without CONFIG_IRQ_TIME_ACCOUNTING that task is charged for it,
 * and nothing per pod shows it. Like softirq time it belongs to the CPU, never to `current`: the
 * aggregation is per CPU and IRQ line only.
 *
 * Hard IRQ handlers do not nest on one CPU (they run with interrupts off since 2.6.35), so one slot
 * per CPU holds the run in progress; an exit whose irq is not the slot's (an entry before attach)
 * is not counted. Entries are counted at the exit with the run time: one map lookup per run. The
 * first run of a line since load also stores the handler's name, off the per-run path.
 *
 * The stats are a plain hash keyed by (irq, cpu), not a per-CPU map by irq: each entry is written by
 * its own CPU only (no atomics, no shared line), and memory follows the (line, CPU) pairs that ever
 * ran, where a per-CPU hash costs every line's value times the *possible* CPUs (1,024 lines of 288
 * bytes were 54 MiB at 192 CPUs, capped at 16 MiB: 303 lines).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "nn_common.h"
#include "hardirq.h"

_Static_assert(sizeof(struct hardirq_stats) == sizeof(struct nn_hist) + 8, "probes/hardirq.py _STATS");
_Static_assert(sizeof(struct hardirq_running) == 16, "probes/hardirq.py MAP_LAYOUTS running");
_Static_assert(sizeof(struct hardirq_name) == NN_IRQ_NAME_LEN, "probes/hardirq.py MAP_LAYOUTS names");
_Static_assert(sizeof(struct hardirq_key) == 8, "probes/hardirq.py _KEY");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct hardirq_running);
} running SEC(".maps");

/* Preallocated: the insert of a new pair runs in hard IRQ context. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, NN_HARDIRQ_PAIRS);
	__type(key, struct hardirq_key);
	__type(value, struct hardirq_stats);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, NN_HARDIRQ_LINES);
	__type(key, __u32);
	__type(value, struct hardirq_name);
} names SEC(".maps");

static const struct hardirq_stats zero_stats;

static __always_inline void on_entry(int irq)
{
	__u32 zero = 0;
	struct hardirq_running *r = bpf_map_lookup_elem(&running, &zero);

	if (!r)
		return;
	r->irq = irq;
	r->entry_ns = bpf_ktime_get_ns();
}

/* The handler's name, read once per (line, CPU) and kept from the line's first (the probe reads of a
 * pointer work in both flavours). */
static __always_inline void remember_name(__u32 irq, struct irqaction *action)
{
	struct hardirq_name n = {};
	const char *name = BPF_CORE_READ(action, name);

	if (name)
		bpf_probe_read_kernel_str(n.name, sizeof(n.name), name);
	bpf_map_update_elem(&names, &irq, &n, BPF_NOEXIST);
}

static __always_inline void on_exit(int irq, struct irqaction *action)
{
	__u64 now = bpf_ktime_get_ns();
	struct hardirq_running *r;
	struct hardirq_stats *s;
	struct hardirq_key key = { .irq = irq };
	__u32 zero = 0;
	__u64 entered;

	r = bpf_map_lookup_elem(&running, &zero);
	if (!r)
		return;
	entered = r->entry_ns;
	r->entry_ns = 0;
	if (!entered || r->irq != key.irq || now < entered)
		return;
	key.cpu = bpf_get_smp_processor_id();
	s = bpf_map_lookup_elem(&stats, &key);
	if (!s) {
		/* The line's first run on this CPU since load: only this CPU creates its pair. */
		if (!bpf_map_update_elem(&stats, &key, &zero_stats, BPF_NOEXIST))
			remember_name(key.irq, action);
		s = bpf_map_lookup_elem(&stats, &key);
		if (!s) {
			count_drop(NN_DROP_KEY_MAP_FULL);
			return;
		}
	}
	nn_hist_add(&s->runtime, now - entered);
	s->entries++;
}

/* ---- tp_btf: BTF-typed tracepoints ----------------------------------------------------------- */

SEC("tp_btf/irq_handler_entry")
int BPF_PROG(hardirq_entry_btf, int irq, struct irqaction *action)
{
	on_entry(irq);
	return 0;
}

SEC("tp_btf/irq_handler_exit")
int BPF_PROG(hardirq_exit_btf, int irq, struct irqaction *action, int ret)
{
	on_exit(irq, action);
	return 0;
}

/* ---- raw_tp fallback: same untyped arguments ------------------------------------------------- */

SEC("raw_tp/irq_handler_entry")
int BPF_PROG(hardirq_entry_raw, int irq, struct irqaction *action)
{
	on_entry(irq);
	return 0;
}

SEC("raw_tp/irq_handler_exit")
int BPF_PROG(hardirq_exit_raw, int irq, struct irqaction *action, int ret)
{
	on_exit(irq, action);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
