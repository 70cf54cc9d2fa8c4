"""``python -m benchmarks [name ...] [options]``: run benchmark modules, print their reports.

Names are modules of this package that define ``main(argv) -> str`` (default: all
of them); everything from the first ``-option`` on is passed to each ``main``.
Each report is printed and written to ``benchmarks/results/<name>.txt``.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
RESULTS = PACKAGE / "results"


def available() -> list[str]:
    """Benchmark modules, found by reading their source: importing them would run
    helpers' module-level code (e.g. a settings module that fixes Django's database)."""
    names = []
    for info in pkgutil.iter_modules([str(PACKAGE)]):
        if info.name.startswith("_") or info.name == "support":
            continue
        if "\ndef main(" in (PACKAGE / f"{info.name}.py").read_text():
            names.append(info.name)
    return sorted(names)


def run(argv: list[str]) -> int:
    split = next((i for i, arg in enumerate(argv) if arg.startswith("-")), len(argv))
    names, options = argv[:split], argv[split:]
    if options in (["-h"], ["--help"]) and not names:
        print(__doc__.strip() + "\n\nBenchmarks: " + ", ".join(available()))
        return 0
    known = available()
    unknown = [name for name in names if name not in known]
    if unknown:
        print(
            f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    RESULTS.mkdir(exist_ok=True)
    for name in names or known:
        report = importlib.import_module(f"{__package__}.{name}").main(options)
        print(report, flush=True)
        path = RESULTS / f"{name}.txt"
        path.write_text(report + "\n")
        print(f"(written to {os.path.relpath(path)})\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
