# SPDX-License-Identifier: Apache-2.0
"""Interference scenario benchmark: test pods, a victim that measures itself, antagonists at a known onset,
the detector detection-only then with actuators, and baselines (no agent, koordlet's threshold policy, bcc).

    python -m bench.scenarios [--only NAME ...] [--repeat N] [--json PATH] [--markdown] [--quick] [--evict]

``--evict`` lets the mitigate mode evict (off by default, as in the agent): the pass's pods are served by a
fake apiserver whose accepted evictions kill the pod's processes (bench/scenarios/kubelet.py).
"""
