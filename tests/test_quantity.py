# SPDX-License-Identifier: Apache-2.0
"""detector.quantity against the Kubernetes Python client's parser, and the import it saves."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from kubernetes.utils import parse_quantity as k8s_parse_quantity

from detector.quantity import parse_quantity

ROOT = Path(__file__).resolve().parents[1]

VALID = [
    "0", "1", "2", "+3", "-4", "500m", "100m", "1500m", "0.5", ".5", "5.", "1.25", "250u", "3n",
    "1k", "64M", "1G", "2T", "1P", "1E", "1Ki", "128Mi", "1.5Gi", "4Ti", "2Pi", "1Ei", "1e3", "1E3",
    "2e-3", "1.5e+2", "12345678901234567890", "0.000001",
]
INVALID = ["", "m", "Ki", "1.2.3", "1 Gi", " 1", "1ki", "1KiB", "abc", "1e", "1e3Ki", "NaN", "Infinity", "--1", "1mi"]


@pytest.mark.parametrize("text", VALID)
def test_every_suffix_gives_the_clients_value(text: str) -> None:
    assert parse_quantity(text) == k8s_parse_quantity(text)


@pytest.mark.parametrize("text", INVALID)
def test_what_is_not_a_quantity_is_a_one_line_error(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity") as e:
        parse_quantity(text)
    assert "\n" not in str(e.value)


def test_json_numbers_and_other_types() -> None:
    assert parse_quantity(2) == Decimal(2)
    assert parse_quantity(0.25) == Decimal("0.25")
    for bad in (True, None, [1], {"cpu": 1}):
        with pytest.raises(ValueError, match="not a quantity"):
            parse_quantity(bad)
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity("1e999999999999999999")


def test_parsing_pods_does_not_load_the_kubernetes_client() -> None:
    """The agent's kubelet path parses every pod's requests: it must not pull in the API client."""
    code = (
        "import json, sys\n"
        "from detector.pods import pods_from_list\n"
        "pod = {'metadata': {'name': 'p', 'namespace': 'n', 'uid': 'u'}, 'spec': {'containers': [\n"
        "    {'name': 'c', 'resources': {'requests': {'cpu': '100m', 'memory': '64Mi'}}}]}, 'status': {}}\n"
        "pods = pods_from_list({'items': [pod]})\n"
        "assert pods[0].cpu_request_cores == 0.1, pods[0]\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'pydantic')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
