#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The krew release archive of `kubectl noisyneighbor` and the manifest's sha256 of it.

    deploy/krew/build.py            write dist/kubectl-noisyneighbor-vVERSION.zip and fill the manifest
                                    (deploy/krew/noisyneighbor.yaml: version, uri, sha256)
    deploy/krew/build.py --check    exit 1 (one line) if the manifest does not match the archive this tree makes

The archive holds the plugin, one stdlib-only file (noisyneighbor/kubectl_plugin.py as
``kubectl-noisyneighbor``), and the LICENSE. It is byte-for-byte reproducible (stored, not compressed;
fixed dates, modes and owner), so the sha256 in the manifest is a function of those two files and the
version: tests/test_kubectl_plugin.py rebuilds it and fails when the manifest was not refreshed. At a
release: run this, upload the zip to the release's assets under the name in ``uri``, then submit the
manifest to krew-index.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import re
import sys
import zipfile
from pathlib import Path

KREW_DIR = Path(__file__).resolve().parent
REPO = KREW_DIR.parent.parent
MANIFEST = KREW_DIR / "noisyneighbor.yaml"
PLUGIN_SOURCE = REPO / "noisyneighbor" / "kubectl_plugin.py"
BINARY = "kubectl-noisyneighbor"
RELEASES = "https://github.com/noisyneighbor/noisyneighbor/releases/download"
# The zip's entries: name in the archive -> (source, mode).
ENTRIES = {BINARY: (PLUGIN_SOURCE, 0o755), "LICENSE": (REPO / "LICENSE", 0o644)}
FIXED_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can hold: no build time in the archive


def version() -> str:
    m = re.search(r'^version\s*=\s*"([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    if m is None:
        raise SystemExit("deploy/krew/build.py: no version in pyproject.toml")
    return m.group(1)


def archive_name(ver: str) -> str:
    return f"{BINARY}-v{ver}.zip"


def archive_bytes() -> bytes:
    """The release zip, the same bytes on every machine for the same files."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, (source, mode) in ENTRIES.items():
            info = zipfile.ZipInfo(name, date_time=FIXED_DATE)
            info.create_system = 3  # Unix: krew takes the mode from external_attr
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_STORED
            zf.writestr(info, source.read_bytes())
    return buf.getvalue()


def manifest_text(current: str, ver: str, sha256: str) -> str:
    """The manifest with its version, uri and sha256 filled in (every other line as written)."""
    text = re.sub(r"(?m)^(  version:) .*$", rf"\1 v{ver}", current)
    text = re.sub(r"(?m)^(\s+uri:) .*$", rf"\1 {RELEASES}/v{ver}/{archive_name(ver)}", text)
    return re.sub(r"(?m)^(\s+sha256:) .*$", rf"\1 {sha256}", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the krew archive and fill its sha256 in the manifest.")
    parser.add_argument("--check", action="store_true", help="only check that the manifest matches")
    args = parser.parse_args(argv)
    ver, data = version(), archive_bytes()
    current = MANIFEST.read_text()
    wanted = manifest_text(current, ver, hashlib.sha256(data).hexdigest())
    if args.check:
        if wanted != current:
            print(f"deploy/krew/build.py: {MANIFEST.name} does not match the archive of this tree: run deploy/krew/build.py",
                  file=sys.stderr)
            return 1
        return 0
    out = REPO / "dist" / archive_name(ver)
    out.parent.mkdir(exist_ok=True)
    out.write_bytes(data)
    MANIFEST.write_text(wanted)
    print(f"{out} sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
