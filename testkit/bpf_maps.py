# SPDX-License-Identifier: Apache-2.0
"""Kernel constants the tests need and the agent does not: the agent never asks a map its type to tell a
ring buffer apart (it knows its own maps by name)."""

BPF_MAP_TYPE_RINGBUF = 27  # enum bpf_map_type (include/uapi/linux/bpf.h)
