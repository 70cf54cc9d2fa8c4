"""The README and docs/*.md say nothing the code does not back.

For each page:

- every ```python block compiles (top-level ``await`` allowed, as in
  ``python -m asyncio``); a block whose info string is ``python fragment`` (a
  dict entry shown on its own) is not compiled;
- every dotted name starting with ``stock_locks.`` in the text imports: a
  module, or an attribute of the longest importable module prefix. A name that
  is not a Python path must be one the library defines: a logger it created, a
  permission of its app, or a string constant of one of its modules (system
  check ids, Celery task and delay-queue handler names);
- every ``from stock_locks... import a, b`` in a code block imports.

Runs under the suite's Django settings; touches no database and no Redis.
"""

from __future__ import annotations

import ast
import importlib
import logging
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(
    r"^(?P<fence>```+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S
)
DOTTED = re.compile(r"(?<![\w./-])stock_locks(?:\.[A-Za-z_]\w*)+")
FROM_IMPORT = re.compile(
    r"^[ \t]*from[ \t]+(?P<module>stock_locks(?:\.\w+)*)[ \t]+import[ \t]+"
    r"(?P<names>\([^)]*\)|[^\n#]+)",
    re.M,
)


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _blocks(text: str) -> list[tuple[int, list[str], str]]:
    """(line of the opening fence, info words, body) of every fenced block."""
    return [(_line(text, m.start()), m["info"].split(), m["body"]) for m in FENCE.finditer(text)]


def _import_longest_prefix(name: str) -> Any:
    """The object ``name`` denotes: the longest importable module prefix, then getattr."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only "this module does not exist" means: try a shorter prefix. A
            # module that exists but imports something missing is an error.
            if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
                continue
            raise
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(name)


def _library_strings() -> set[str]:
    """Module-level string constants of every stock_locks module (each imported
    first, so a page's check does not depend on what earlier pages imported)."""
    import stock_locks

    for info in pkgutil.walk_packages(stock_locks.__path__, "stock_locks."):
        importlib.import_module(info.name)
    found = set()
    for module_name, module in list(sys.modules.items()):
        if module is not None and module_name.partition(".")[0] == "stock_locks":
            found.update(v for v in vars(module).values() if isinstance(v, str))
    return found


def _not_a_python_path(name: str) -> str | None:
    """What library-defined name ``name`` is (logger, permission, constant), or None."""
    if isinstance(logging.root.manager.loggerDict.get(name), logging.Logger):
        return "logger"
    label, _, codename = name.partition(".")
    config = apps.get_app_config(label)
    for model in config.get_models():
        if codename in {c for c, _ in model._meta.permissions}:
            return "permission"
    if name in _library_strings():
        return "string constant"
    return None


def _check_name(name: str) -> str | None:
    """None if ``name`` is backed by the library, else why not."""
    try:
        _import_longest_prefix(name)
        return None
    except (ImportError, AttributeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    if _not_a_python_path(name):
        return None
    return error


def _check_from_import(module_name: str, name: str) -> str | None:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    if hasattr(module, name):
        return None
    try:  # `from package import submodule`
        importlib.import_module(f"{module_name}.{name}")
    except ModuleNotFoundError:
        return f"cannot import name {name!r} from {module_name!r}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_compile(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    problems = []
    for line, info, body in _blocks(text):
        if info[:1] != ["python"] or "fragment" in info[1:]:
            continue
        try:
            compile(
                body,
                f"{page.name}:{line}",
                "exec",
                flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
                dont_inherit=True,
            )
        except SyntaxError as exc:
            problems.append(f"{page.name}:{line + (exc.lineno or 0)}: {exc.msg}")
    assert not problems, "Python blocks that do not compile:\n" + "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_stock_locks_names_import(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    problems = []
    seen = set()
    for match in DOTTED.finditer(text):
        name = match.group().rstrip(".")
        if name in seen:
            continue
        seen.add(name)
        if error := _check_name(name):
            problems.append(f"{page.name}:{_line(text, match.start())}: {name}: {error}")
    for line, _info, body in _blocks(text):
        for match in FROM_IMPORT.finditer(body):
            names = match["names"].strip().strip("()")
            for item in names.split(","):
                name = item.split(" as ")[0].strip()
                if not name:
                    continue
                if error := _check_from_import(match["module"], name):
                    at = f"{page.name}:{line + _line(body, match.start())}"
                    problems.append(f"{at}: from {match['module']} import {name}: {error}")
    assert not problems, "names the docs use that the code does not have:\n" + "\n".join(problems)
