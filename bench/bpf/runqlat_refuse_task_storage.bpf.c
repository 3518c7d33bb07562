// SPDX-License-Identifier: GPL-2.0
/*
 * Test-only variant of bpf/runqlat.bpf.c: every task-storage get is refused, as a create now and then
 * is under load (a storage call nested in another on one CPU, a failed atomic allocation), so all of
 * the tp_btf flavour's start times take the pid-hash path that catches those
 * (tests/test_runqlat.py). Never shipped: bench/variant_objects.py builds it (`make bench-bpf`) and
 * loads it in place of runqlat.bpf.o; the shipped source holds no test hook.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#define bpf_task_storage_get(map, task, value, flags) ((void *)0)
#include "runqlat.bpf.c"
