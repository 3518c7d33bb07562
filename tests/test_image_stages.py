# SPDX-License-Identifier: Apache-2.0
"""docker/Dockerfile and scripts/build-image-stages.sh: the image's stages, run on this machine.

No container engine runs here, so the slow test runs the Dockerfile's stages through the shared scripts
(docker/build-stage.sh, install-runtime.sh, check-runtime.sh) in a temp dir; the fast tests keep the
Dockerfile calling those same scripts and installing what scripts/setup.sh installs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "docker" / "Dockerfile"
SCRIPT = REPO / "scripts" / "build-image-stages.sh"
BUILD_PACKAGES = {"clang", "llvm", "libbpf-dev", "bpftool", "make"}
COMPILER_PACKAGES = {"clang", "llvm", "gcc", "libbpf-dev", "bpftool", "make", "build-essential"}


def instructions() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def stages() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for ins in instructions():
        if ins.upper().startswith("FROM "):
            current = ins.split()[-1].lower()
            out[current] = []
        elif current is not None:
            out[current].append(ins)
    return out


def apt_packages(stage: list[str]) -> set[str]:
    pkgs: set[str] = set()
    for ins in stage:
        for m in re.finditer(r"apt-get install([^&;]*)", ins):
            pkgs |= {w.split("=")[0] for w in m.group(1).split() if not w.startswith("-")}
    return pkgs


def setup_sh_build_packages() -> set[str]:
    m = re.search(r"^pkgs=\(([^)]*)\)", (REPO / "scripts" / "setup.sh").read_text(), re.M)
    assert m, "scripts/setup.sh has no pkgs=(...) line"
    return set(m.group(1).split())


def test_dockerfile_stages_call_the_shared_scripts() -> None:
    s = stages()
    assert list(s) == ["build", "runtime"]
    runs = {name: " ".join(i for i in body if i.startswith("RUN ")) for name, body in s.items()}
    assert "docker/build-stage.sh /src /dist" in runs["build"]
    assert "install-runtime.sh /tmp/wheels /opt/noisyneighbor" in runs["runtime"]
    assert "NN_CHECK_IMAGE=1 bash /usr/local/lib/noisyneighbor/check-runtime.sh /opt/noisyneighbor" in runs["runtime"]
    for name in ("build-stage.sh", "install-runtime.sh", "check-runtime.sh"):
        assert os.access(REPO / "docker" / name, os.X_OK), f"docker/{name} is not executable"


def test_dockerfile_packages_match_setup_sh() -> None:
    s = stages()
    build = apt_packages(s["build"])
    assert build >= BUILD_PACKAGES
    # The build stage installs what setup.sh installs to build, except the venv (the image's Python has it).
    assert build == setup_sh_build_packages() - {"python3-venv"}
    runtime = apt_packages(s["runtime"])
    assert runtime == {"libbpf1"}
    assert not runtime & COMPILER_PACKAGES


def test_dockerfile_runtime_metadata() -> None:
    runtime = stages()["runtime"]
    assert 'ENTRYPOINT ["noisyneighbor"]' in runtime
    assert 'CMD ["agent"]' in runtime
    users = [i.split()[1] for i in runtime if i.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in {"0", "root"}, "the image must default to a non-root user"
    labels = " ".join(i for i in runtime if i.startswith("LABEL "))
    for key in ("title", "description", "version", "revision", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert "EXPOSE 9717" in runtime
    # Both stages from one Debian bookworm Python of the version the project needs.
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.1[1-9]-slim-bookworm@sha256:[0-9a-f]{64}$", DOCKERFILE.read_text(), re.M)
    assert [i for i in instructions() if i.startswith("FROM ")] == [
        "FROM ${PYTHON_IMAGE} AS build", "FROM ${PYTHON_IMAGE} AS runtime"]


def test_dockerfile_builds_from_pinned_inputs_only() -> None:
    """Base image by digest, Debian packages by version from a snapshot date, Python by hash, the vendored
    vmlinux.h: nothing in the build follows a moving tag, a mirror's latest or the build host's kernel."""
    text = DOCKERFILE.read_text()
    froms = [i for i in instructions() if i.startswith("FROM ")]
    assert froms and all(f.split()[1] == "${PYTHON_IMAGE}" for f in froms)
    assert re.search(r"^ARG DEBIAN_SNAPSHOT=\d{8}T\d{6}Z$", text, re.M)
    for name, body in stages().items():
        runs = [i for i in body if i.startswith("RUN ")]
        installs = [m.group(1) for i in runs for m in re.finditer(r"apt-get install([^&;]*)", i)]
        assert installs, name
        for words in installs:
            for w in words.split():
                if not w.startswith("-"):
                    assert re.fullmatch(r"[a-z0-9.+-]+=[0-9A-Za-z.:~+-]+", w), f"{name}: {w} has no version"
        for i in runs:
            if "apt-get install" in i:
                assert 'apt-snapshot.sh "${DEBIAN_SNAPSHOT}"' in i, f"{name}: apt without the snapshot"
            assert "apt-get update" not in i, f"{name}: apt-get update of the live mirror"
    # Python: the lock, with hashes, and nothing resolved beyond it.
    runtime = " ".join(stages()["runtime"])
    assert "LOCK=/usr/local/lib/noisyneighbor/requirements.lock" in runtime
    install = (REPO / "docker" / "install-runtime.sh").read_text()
    assert '--require-hashes --no-deps -r "$LOCK"' in install
    lock = (REPO / "docker" / "requirements.lock").read_text()
    pins = re.findall(r"^([a-z0-9_.-]+)==(\S+) \\$", lock, re.M)
    assert pins and all(f"{n}=={v}" in lock for n, v in pins)
    blocks = re.split(r"\n(?=[a-z0-9_.-]+==)", lock.split("\n", 7)[-1])
    assert all("--hash=sha256:" in b for b in blocks if "==" in b)
    for dep in ("prometheus-client", "kubernetes", "numpy", "pyyaml", "rich", "nvidia-ml-py"):
        assert any(n == dep for n, _ in pins), f"{dep} is not locked"
    # BPF: the vendored header only.
    assert "VMLINUX_SOURCE=vendored bash docker/build-stage.sh /src /dist" in " ".join(stages()["build"])
    assert "VMLINUX_SOURCE ?= auto" in (REPO / "Makefile").read_text()


def test_make_uses_the_vendored_vmlinux_h_when_asked(tmp_path: Path) -> None:
    """`make VMLINUX_SOURCE=vendored` copies bpf/vmlinux/<arch>/vmlinux.h even on a host with BTF."""
    import platform
    import shutil

    vendored = REPO / "bpf" / "vmlinux" / platform.machine() / "vmlinux.h"
    if not vendored.exists():
        pytest.skip(f"no vendored vmlinux.h for {platform.machine()}")
    shutil.copytree(REPO, tmp_path / "src", ignore=shutil.ignore_patterns(".venv", ".git", ".output", "*.o"))
    res = subprocess.run(["make", "-s", "-C", str(tmp_path / "src"), "bpf/.output/vmlinux.h", "VMLINUX_SOURCE=vendored"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "src" / "bpf" / ".output" / "vmlinux.h").read_bytes() == vendored.read_bytes()


def test_dockerignore_covers_gitignore() -> None:
    """The build context leaves out what git ignores, as the script's clean copy does."""
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for pattern in (REPO / ".gitignore").read_text().split():
        assert pattern in ignored or f"**/{pattern}" in ignored, f".dockerignore lacks {pattern}"
    assert ".git" in ignored


def test_script_refuses_a_dockerfile_it_does_not_match(tmp_path: Path) -> None:
    """The script reads the Dockerfile first: one that no longer calls the shared build script is an error."""
    broken = tmp_path / "Dockerfile"
    broken.write_text(DOCKERFILE.read_text().replace("docker/build-stage.sh /src /dist", "make bpf && pip wheel ."))
    r = subprocess.run(["bash", str(SCRIPT), "--keep", str(tmp_path / "work")], capture_output=True, text=True,
                       timeout=60, env=os.environ | {"DOCKERFILE": str(broken)})
    assert r.returncode == 1
    assert "does not RUN build-stage.sh" in r.stderr
    assert not (tmp_path / "work" / "src").exists(), "it went on after the Dockerfile check"


@pytest.mark.slow
def test_build_image_stages(tmp_path: Path) -> None:
    for tool in ("clang", "make", "git"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup.sh installs the build tools)")
    work = tmp_path / "stages"
    r = subprocess.run(["bash", str(SCRIPT), "--keep", str(work)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "build-image-stages: ok" in r.stderr
    wheels = list((work / "dist").glob("noisyneighbor-*.whl"))
    assert len(wheels) == 1
    site = next((work / "venv" / "lib").glob("python3.*/site-packages"))
    objects = sorted(p.name for p in (site / "probes" / "bpf_objects").glob("*.bpf.o"))
    want = sorted(p.name[: -len(".c")] + ".o" for p in (REPO / "bpf").glob("*.bpf.c"))
    assert objects == want
    for unshipped in ("tests", "testkit", "bench"):
        assert not (site / unshipped).exists(), f"{unshipped} shipped in the wheel"

    check = REPO / "docker" / "check-runtime.sh"
    # The runtime check can fail: on this build host clang exists, so the image-mode check refuses it...
    r = subprocess.run(["bash", str(check), str(work / "venv")], capture_output=True, text=True,
                       timeout=120, env=os.environ | {"NN_CHECK_IMAGE": "1"})
    assert r.returncode == 1 and "clang is in the runtime image" in r.stderr
    # ...and a venv whose package lost its BPF objects is refused.
    for o in (site / "probes" / "bpf_objects").glob("*.bpf.o"):
        o.unlink()
    r = subprocess.run(["bash", str(check), str(work / "venv")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "no BPF objects" in r.stderr
