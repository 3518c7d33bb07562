"""The wheel ships every package: setuptools installs only the packages pyproject.toml lists, so a
module split into a package (detector.pods, ...) must be listed or the image lacks it."""

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
