"""The library's house rules that no linter checks: imports inside functions only for
an optional extra or Django's app loading, each with its reason on the line, and no
module past ~550 lines without a reason here. (The layers and the absence of import
cycles are import-linter's contracts in pyproject.toml, run by the lint step.)"""

from __future__ import annotations

import ast
from pathlib import Path

import stock_locks

LIBRARY = Path(stock_locks.__file__).parent
MAX_LINES = 560  # "about 550"

# Imports inside functions, by module: what they import, each for one of the two reasons.
OPTIONAL_EXTRAS = {"celery", "prometheus_client", "kazoo"}
APP_LOADING = {
    # AppConfig.ready(): these modules import the models, and register handlers and checks.
    ("stock_locks.apps", "stock_locks.checks"),
    ("stock_locks.apps", "stock_locks.delayqueue"),
    ("stock_locks.apps", "stock_locks.stock"),
    # ready() connects the heartbeats' roles to Django's and Celery's signals.
    ("stock_locks.apps", "stock_locks.metrics"),
    # A Celery worker imports the tasks before Django's apps are ready.
    ("stock_locks.tasks", "stock_locks.stock.sweeper"),
}
# Modules longer than MAX_LINES, and why.
LONG_MODULES: dict[str, str] = {}


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(LIBRARY.rglob("*.py")):
        parts = path.relative_to(LIBRARY.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.append((name, path))
    return found


def _resolved(module: str, path: Path, node: ast.ImportFrom | ast.Import) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not node.level:
        return [node.module or ""]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    if node.module:
        return [".".join([*base, node.module])]
    return [".".join([*base, alias.name]) for alias in node.names]  # from . import checks


def _function_imports() -> list[tuple[str, str, str]]:
    """(module, imported, the import's line) of every import inside a function."""
    found = []
    for module, path in _modules():
        source = path.read_text()
        lines = source.splitlines()
        for function in ast.walk(ast.parse(source)):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    for imported in _resolved(module, path, node):
                        found.append((module, imported, lines[node.lineno - 1]))
    return found


def test_imports_inside_functions_are_for_extras_and_app_loading_with_a_reason():
    unexplained = []
    for module, imported, line in _function_imports():
        extra = imported.split(".")[0] in OPTIONAL_EXTRAS
        loading = any(
            module == importer and (imported == target or imported.startswith(target + "."))
            for importer, target in APP_LOADING
        )
        if not (extra or loading) or "# (" not in line:
            unexplained.append(f"{module}: {line.strip()}")
    assert not unexplained, "imports inside functions without an allowed reason:\n" + "\n".join(
        unexplained
    )


def test_the_rule_sees_an_import_inside_a_function():
    imports = _function_imports()
    assert ("stock_locks.apps", "stock_locks.checks") in {(m, i) for m, i, _ in imports}


def test_no_library_module_is_longer_than_the_limit_without_a_reason():
    long = {
        module: count
        for module, path in _modules()
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert set(long) <= set(LONG_MODULES), f"modules over {MAX_LINES} lines: {long}"
