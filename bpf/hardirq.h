// SPDX-License-Identifier: GPL-2.0
/*
 * hardirq probe: map values (mirrored by struct in probes/hardirq.py, sizes checked at load).
 * Fixed-width types only, every struct padded to 8 bytes.
 */
#ifndef NN_HARDIRQ_H
#define NN_HARDIRQ_H

#include "nn_events.h"

/* IRQ lines named (a node's lines that ever ran a handler). */
#define NN_HARDIRQ_LINES 1024
/* (CPU, IRQ line) pairs kept: lines are mostly bound to one CPU each (a multi-queue device has a
 * line per queue); the loader may resize. */
#define NN_HARDIRQ_PAIRS 2048
#define NN_IRQ_NAME_LEN 32

/* Per CPU: the handler in progress. Hot path only, never read by userspace. */
struct hardirq_running {
	__u64 entry_ns; /* irq_handler_entry; 0: none in progress (or it began before attach) */
	__u32 irq;
	__u32 _pad;
};

/* Stats key: one IRQ line on one CPU. */
struct hardirq_key {
	__u32 irq;
	__u32 cpu;
};

/* Per (IRQ line, CPU), written by that CPU only: cumulative since load. */
struct hardirq_stats {
	struct nn_hist runtime; /* irq_handler_entry → irq_handler_exit */
	__u64 entries;          /* handler runs: one per action of the line (one per interrupt unless shared) */
};

/* Per IRQ line: the name its first handler seen since load registered (irqaction->name). */
struct hardirq_name {
	char name[NN_IRQ_NAME_LEN];
};

#endif /* NN_HARDIRQ_H */
