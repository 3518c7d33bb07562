# SPDX-License-Identifier: Apache-2.0
"""The wheel ships every package: setuptools installs only the packages pyproject.toml lists, so a
module split into a package (detector.pods, ...) must be listed or the image lacks it."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_directory_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    top = {name.split(".")[0] for name in listed}
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for name in top
        for init in (ROOT / name).rglob("__init__.py")
    }
    assert listed == on_disk


def test_dev_extra_pins_kubernetes_validate_to_1_33_or_newer():
    """Issue 17's acceptance: renderings validated against Kubernetes >= 1.33. tests/test_deploy.py checks the
    installed schemas; the pin makes a fresh `pip install -e '.[dev]'` get such a kubernetes-validate."""
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    [spec] = [r for r in dev if re.match(r"kubernetes-validate\b", r)]
    m = re.fullmatch(r"kubernetes-validate>=(\d+)\.(\d+)(\.\d+)?", spec.replace(" ", ""))
    assert m and (int(m[1]), int(m[2])) >= (1, 33), spec
