# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the tests (tests/) and the benchmarks (bench/): owned cgroups (sandbox), the fake
kubelet/apiserver (fakekube), scenario pods, the agent as a process (exporter_support), bench variant BPF
objects. Not shipped: pyproject.toml does not list it, so neither the wheel nor the image holds it, and no
shipped package imports it (tests/test_shipped_imports.py). tests/ and bench/ import it, never each other.
"""
