# SPDX-License-Identifier: Apache-2.0
"""Licence files and SPDX lines: Apache-2.0 for the Python and the deployment, GPL-2.0 for the BPF programs."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPDX = re.compile(r"SPDX-License-Identifier: (\S+)")
# What is shipped or run as source: Python, shell, the BPF C and its headers, and the scripts without a suffix.
# Not the vendored vmlinux.h (generated from a kernel's BTF) nor build outputs.
SOURCE_SUFFIXES = {".py", ".sh", ".c", ".h"}
NAMED_SCRIPTS = {".ci/run", "Makefile", "docker/Dockerfile"}
SKIP_DIRS = {".git", ".venv", "__pycache__", ".output", "bpf_objects", "build", "dist", ".pytest_cache", ".ruff_cache"}
GPL_IDS = ("GPL-2.0", "GPL-2.0-only", "GPL-2.0-or-later")


def _source_files() -> list[Path]:
    found = []
    for top, dirs, names in os.walk(REPO):  # not following symlinks (.venv may be one)
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        rel_top = Path(top).relative_to(REPO)
        if rel_top.parts[:2] == ("bpf", "vmlinux"):
            continue
        for name in names:
            rel = rel_top / name
            if rel.suffix in SOURCE_SUFFIXES or rel.as_posix() in NAMED_SCRIPTS:
                found.append(REPO / rel)
    return sorted(found)


def _spdx(path: Path) -> str | None:
    head = "\n".join(path.read_text(errors="replace").splitlines()[:3])
    m = SPDX.search(head)
    return m.group(1) if m else None


def test_licence_texts_are_there():
    apache = (REPO / "LICENSE").read_text()
    assert "Apache License" in apache and "Version 2.0, January 2004" in apache
    assert (REPO / "LICENSES" / "Apache-2.0.txt").read_text() == apache
    gpl = (REPO / "LICENSES" / "GPL-2.0-only.txt").read_text()
    assert "GNU GENERAL PUBLIC LICENSE" in gpl and "Version 2, June 1991" in gpl


def test_every_bpf_program_is_gpl_2():
    programs = sorted((REPO / "bpf").glob("*.bpf.c"))
    assert programs
    for p in programs:
        assert _spdx(p) in ("GPL-2.0", "GPL-2.0-only", "GPL-2.0-or-later"), p.name
        assert re.search(r'char\s+license\s*\[\]\s*SEC\("license"\)\s*=\s*"(Dual BSD/)?GPL"', p.read_text(), re.I), \
            f"{p.name}: no GPL license section (the kernel checks it)"


def test_every_source_file_carries_its_spdx_line():
    """C (BPF programs and headers): GPL-2.0; everything else (Python, shell, Makefile, Dockerfile): Apache-2.0."""
    files = _source_files()
    assert len(files) > 200 and REPO / "noisyneighbor" / "kubectl_plugin.py" in files
    assert not any("vmlinux" in f.parts for f in files)
    wrong = {}
    for f in files:
        want = GPL_IDS if f.suffix in (".c", ".h") else ("Apache-2.0",)
        if _spdx(f) not in want:
            wrong[str(f.relative_to(REPO))] = _spdx(f)
    assert not wrong, wrong


def test_the_image_says_both_licences():
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert 'org.opencontainers.image.licenses="Apache-2.0 AND GPL-2.0-only"' in dockerfile
    assert "COPY --from=build /src/LICENSES/" in dockerfile
