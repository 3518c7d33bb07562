# SPDX-License-Identifier: Apache-2.0
"""`noisyneighbor completion bash`: the script, sourced in a real bash, completes what the parser accepts."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from noisyneighbor.cli import build_parser
from noisyneighbor.top import VIEW_CHOICES
from testkit.tools import require_tool

CLI = [sys.executable, "-m", "noisyneighbor.cli"]


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> str:
    res = subprocess.run([*CLI, "completion", "bash"], capture_output=True, text=True, timeout=60, check=True)
    path = tmp_path_factory.mktemp("completion") / "nn.bash"
    path.write_text(res.stdout)
    return str(path)


def complete(script: str, line: str) -> list[str]:
    """COMPREPLY for the command line `line` (completing its last word, empty after a trailing space)."""
    bash = require_tool("bash")
    words = shlex.split(line) + ([""] if line.endswith(" ") else [])
    program = (f"source {shlex.quote(script)}\nCOMP_WORDS=({' '.join(shlex.quote(w) for w in words)})\n"
               f"COMP_CWORD={len(words) - 1}\n_noisyneighbor\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n")
    res = subprocess.run([bash, "--norc", "-c", program], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return [w for w in res.stdout.splitlines() if w]


def test_subcommands_and_global_flags(script):
    assert set(complete(script, "noisyneighbor ")) >= {"top", "agent", "diagnose", "completion", "--version"}
    assert complete(script, "noisyneighbor di") == ["diagnose"]


def test_every_option_of_a_subcommand_is_offered(script):
    for name in ("top", "agent", "diagnose"):
        sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
        flags = {o for action in sub.choices[name]._actions for o in action.option_strings}
        assert set(complete(script, f"noisyneighbor {name} ")) == flags, name


def test_option_values_and_files(script, tmp_path):
    # Every view the parser accepts (one per registered probe with a view, then psi and all), in its order.
    views = complete(script, "noisyneighbor top --view ")
    assert views == list(VIEW_CHOICES) and views[:4] == ["runq", "softirq", "reclaim", "tcp"] and views[-2:] == ["psi", "all"]
    assert complete(script, "noisyneighbor diagnose --pods k") == ["kubelet"]
    assert {"bash", "zsh"} <= set(complete(script, "noisyneighbor completion "))
    (tmp_path / "report-here.html").write_text("")
    assert complete(script, f"noisyneighbor diagnose --html {tmp_path}/report-") == [f"{tmp_path}/report-here.html"]


def test_zsh_script_loads_bashcompinit():
    res = subprocess.run([*CLI, "completion", "zsh"], capture_output=True, text=True, timeout=60, check=True)
    assert res.stdout.startswith("autoload -U +X bashcompinit && bashcompinit\n") and "complete -F" in res.stdout
