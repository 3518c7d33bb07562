// SPDX-License-Identifier: GPL-2.0
/*
 * Map value and event layouts shared between the BPF programs and their Python decoders
 * (the probes/ modules mirror these structs with ctypes; tests check the sizes match the BTF).
 * Only fixed-width types, every struct padded to 8 bytes.
 */
#ifndef NN_EVENTS_H
#define NN_EVENTS_H

#define NN_HIST_SLOTS 32 /* log2 µs slots: slot k holds [2^(k-1), 2^k) µs; the last one everything above */
#define NN_COMM_LEN 16

/* A latency distribution: log2 histogram in µs, exact sum and count in ns, max since load. */
struct nn_hist {
	__u64 slots[NN_HIST_SLOTS];
	__u64 sum_ns;
	__u64 count;
	__u64 max_ns;
};

/* Why an event was not counted. Per-CPU counters, exported, never silent. */
enum nn_drop_reason {
	NN_DROP_TASK_STORAGE = 0, /* bpf_task_storage_get() could not create storage */
	NN_DROP_KEY_MAP_FULL = 1, /* per-key aggregation map full: insert failed */
	NN_DROP_RINGBUF_FULL = 2, /* outlier event lost: ring buffer full */
	NN_DROP_START_MAP_FULL = 3, /* fallback start-time hash map full */
	NN_DROP_REASONS = 4,
};

#endif /* NN_EVENTS_H */
