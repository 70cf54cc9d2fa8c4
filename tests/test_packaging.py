"""Packaging: the lowest-versions environment really pins pyproject's lower bounds,
and what a user installs carries its types, license and data files."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9._-]+)(\[[^\]]*\])?==([0-9][0-9.]*)$")
LOWER = re.compile(r"^([A-Za-z0-9._-]+)(\[[^\]]*\])?>=([0-9][0-9.]*)$")


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lines(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_lowest_requirements_pin_every_lower_bound_of_pyproject():
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    declared = [
        *project["dependencies"],
        *extras["celery"],
        *extras["zookeeper"],
        *extras["prometheus"],
    ]
    bounds = {}
    for spec in declared:
        match = LOWER.match(spec.replace(" ", ""))
        assert match, f"pyproject dependency {spec!r} has no plain '>=' lower bound"
        bounds[_name(match[1])] = match[3]
    pins = {}
    for line in _lines(ROOT / "requirements-min.txt"):
        match = PIN.match(line)
        if match:
            pins[_name(match[1])] = match[3]
    assert pins == bounds


def test_lowest_test_tools_are_the_ranges_of_requirements_txt():
    def name(line: str) -> str:
        return _name(re.split(r"[\[<>=!~;]", line, maxsplit=1)[0])

    newest = {name(line): line for line in _lines(ROOT / "requirements.txt")}
    tools = [line for line in _lines(ROOT / "requirements-min.txt") if not PIN.match(line)]
    assert "pytest>=8.3,<10" in tools
    assert [line for line in tools if name(line) in newest and newest[name(line)] != line] == []


def test_package_data_ships_types_license_scripts_and_templates():
    config = _pyproject()
    package_data = config["tool"]["setuptools"]["package-data"]["stock_locks"]
    assert "py.typed" in package_data
    assert (ROOT / "stock_locks" / "py.typed").is_file()
    assert "lua/*.lua" in package_data
    assert any(pattern.startswith("templates/") for pattern in package_data)
    assert config["project"]["license"] == "MIT"
    assert config["project"]["license-files"] == ["LICENSE"]
    assert "MIT License" in (ROOT / "LICENSE").read_text()
