# SPDX-License-Identifier: Apache-2.0
"""One regime for probes (issue 42, item 1): a probe's name appears in the code of its own module, its
cause module and the registries only (its BPF and the docs are not Python). The registries are the probe
registry (probes/registry.py imports each probe module) and the cause registry
(detector/causes/__init__.py imports each cause module, as the probe registry does each probe), and the
kernel-file registry, probes/cgroupfiles.py: it declares every kernel file with its fields by the kernel's
own names (proc(5)'s /proc/stat columns ``softirq`` and ``steal``, parsed and exported as CPU modes
whether or not a probe runs) and imports no probe. Everything else (the snapshot, the signal rows, the
exporter, metric_names, diagnose, top and the CLI) takes the probe from its plugin.

"Appears" means in code: identifiers (split at ``_`` and at case changes, so ``SoftirqSnapshot`` and
``softirq_ms_per_s`` name softirq) and string literals; comments and docstrings are prose about the kernel
(softirq work, memory reclaim, steal time) and are not counted. The files still naming a probe today are
listed below with the reason; a new one fails, and so does an entry that is no longer needed, so the
lists only shrink.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from probes.registry import PLUGINS

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_PACKAGES = ("probes", "detector", "actuators", "noisyneighbor")

# The registries: each imports its modules by name, one line each.
REGISTRIES = frozenset({"probes/registry.py", "detector/causes/__init__.py"})
# The kernel-file table: kernel files and their fields, named as the kernel names them.
KERNEL_FILE_REGISTRY = "probes/cgroupfiles.py"

# Files besides a probe's own that still name it, and why (today's honest state).
KNOWN: dict[str, dict[str, str]] = {
    "softirq": {
        "probes/runqlat.py": "runqlat's BPF times the softirq work run inside a wait (the counterfactual)",
    },
    "reclaim": {
        # Not the probe: Koordinator's colocation-config word (cpuReclaimThresholdPercent,
        # memoryReclaimThresholdPercent: the share of the node batch pods may reclaim), kept as the policy
        # file's keys users write, so renaming them would change the policy format.
        "detector/batch.py": "Koordinator's batch formula: Node.Reserved from the reclaim threshold percents",
        "detector/policy/schema.py": "the policy keys cpu_/memory_reclaim_threshold_percent (colocation-config)",
    },
    "gpu": {
        "probes/gpu.py": "the NVML reader of the plugin's probe and node reader (the word is the hardware's)",
    },
}

# At most this many runtime files name softirq (issue 42's acceptance: <= 6): the softirq module, its
# cause module, the registries (the kernel-file table among them), and KNOWN["softirq"].
SOFTIRQ_FILES_BOUND = 6


def _words(text: str) -> list[str]:
    """Lower-case words of an identifier or string: split at non-letters and at case changes."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text)
    return [w for w in re.split(r"[^a-zA-Z0-9]+", spaced.lower()) if w]


def _names(words: list[str], name: list[str]) -> bool:
    n = len(name)
    return any(words[i:i + n] == name for i in range(len(words) - n + 1))


def mentions(source: str, probe: str) -> list[int]:
    """Lines whose code (identifiers and string literals, not comments or docstrings) names ``probe``."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            docstrings.add(body[0].lineno)
    name = _words(probe)
    lines = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING and tok.start[0] in docstrings:
            continue
        code = tok.type in (tokenize.NAME, tokenize.STRING) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1)
        if code and _names(_words(tok.string), name):
            lines.append(tok.start[0])
    return lines


def _runtime_files() -> list[str]:
    return sorted(str(f.relative_to(ROOT)) for pkg in RUNTIME_PACKAGES for f in (ROOT / pkg).rglob("*.py"))


def files_naming(*words: str) -> set[str]:
    return {f for f in _runtime_files() for w in words if mentions((ROOT / f).read_text(), w)}


def _module_name(plugin) -> str:
    return plugin.factory.__module__.rsplit(".", 1)[-1]


def own_files(plugin) -> set[str]:
    """Its module, the registries, and its cause module (detector/causes/<...name...>.py)."""
    module = plugin.factory.__module__.replace(".", "/") + ".py"
    causes = {str(f.relative_to(ROOT)) for f in (ROOT / "detector" / "causes").glob(f"*{plugin.name}*.py")}
    return {module, *REGISTRIES, KERNEL_FILE_REGISTRY, *causes}


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.name)
def test_a_probe_is_named_only_where_it_lives(plugin):
    naming = files_naming(plugin.name, _module_name(plugin))
    known = KNOWN.get(plugin.name, {})
    extra = sorted(naming - own_files(plugin) - known.keys())
    assert not extra, f"{plugin.name} is named outside its module, cause and the registry: {extra}"
    stale = sorted(known.keys() - naming)
    assert not stale, f"KNOWN[{plugin.name!r}] lists files that no longer name it (drop them): {stale}"


def test_softirq_is_in_few_runtime_files():
    naming = files_naming("softirq")
    assert len(naming) <= SOFTIRQ_FILES_BOUND, sorted(naming)


def test_the_check_sees_a_name_and_skips_prose():
    source = ('"""Softirq work is prose here."""\n'
              "x = SoftirqSnapshot  # softirq in a comment\n"
              "y = 'noisyneighbor_softirq_runtime_seconds'\n"
              "z = snap.probe(NAME)\n"
              "w = row.gpu_pods_seen\n")
    assert mentions(source, "softirq") == [2, 3]
    assert mentions(source, "gpu_pods") == [5]
    assert mentions(source, "steal") == []


def test_the_agents_probe_flags_come_from_the_plugins_options():
    """A probe's settings are its plugin's (ProbePlugin.options): the agent's parser builds their flags,
    hands the values to the probe's factory by keyword, and refuses one out of range in one line."""
    from detector.policy import Policy
    from noisyneighbor.agent.config import AgentConfig, AgentConfigError
    from noisyneighbor.cli import _probe_flags, build_parser

    flagged = [(p, o) for p in PLUGINS for o in p.options if o.flag]
    assert {o.flag for _, o in flagged} >= {"--runq-cgroups", "--runq-pairs"}
    for plugin, option in flagged:
        given = _probe_flags(build_parser().parse_args(["agent", option.flag, "5"]))
        assert given[plugin.name][option.name] == 5
        assert plugin.agent_options(given[plugin.name], Policy(), 0)[option.name] == 5
        unset = _probe_flags(build_parser().parse_args(["agent"]))
        assert option.name not in plugin.agent_options(unset[plugin.name], Policy(), 0)  # the probe's default
        if option.range is not None:
            with pytest.raises(AgentConfigError, match=f"^{option.label} must be between") as e:
                AgentConfig(probe_options={plugin.name: {option.name: option.range[1] + 1}}).validate()
            assert "\n" not in str(e.value)
