"""``python -m benchmarks [name ...] [options]``: run benchmark modules, print their reports.

Names are modules of this package that define ``main(argv) -> str`` (default: all
of them); everything from the first ``-option`` on is passed to each ``main``.
Each report is printed and written to ``benchmarks/results/<name>.txt``; a run of
all of them (``make bench``) also writes ``benchmarks/results/REPORT.md`` and its
PNG plots (benchmarks/report.py). A progress bar goes to stderr.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import time
from pathlib import Path

from . import report, support

PACKAGE = Path(__file__).resolve().parent
RESULTS = PACKAGE / "results"


def available() -> list[str]:
    """Benchmark modules, found by reading their source: importing them would run
    helpers' module-level code (e.g. a settings module that fixes Django's database)."""
    names = []
    for info in pkgutil.iter_modules([str(PACKAGE)]):
        if info.name.startswith("_") or info.name in ("support", "report"):
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
    chosen = names or known
    runs: list[report.ModuleRun] = []
    began = time.monotonic()
    for i, name in enumerate(chosen):
        _bar(i, len(chosen), name, began)
        support.FIGURES.clear()
        started = time.monotonic()
        text = importlib.import_module(f"{__package__}.{name}").main(options)
        runs.append(report.ModuleRun(name, text, time.monotonic() - started,
                                     dict(support.FIGURES)))  # fmt: skip
        print(text, flush=True)
        path = RESULTS / f"{name}.txt"
        path.write_text(text + "\n")
        print(f"(written to {os.path.relpath(path)})\n", flush=True)
    _bar(len(chosen), len(chosen), "done", began)
    if not names:
        path = report.write(runs, time.monotonic() - began)
        print(f"report: {os.path.relpath(path)} (and its plots beside it)", flush=True)
    return 0


def _bar(done: int, total: int, name: str, began: float) -> None:
    width = 30
    filled = width * done // total
    elapsed = int(time.monotonic() - began)
    print(
        f"[bench] [{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
        f"{elapsed // 60}m{elapsed % 60:02d}s  {name}",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
