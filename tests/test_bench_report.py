"""The benchmark report writer (benchmarks/report.py) on figures of a tiny fake run."""

from __future__ import annotations

import pytest

from benchmarks import report


def test_the_report_gathers_targets_texts_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    runs = [
        report.ModuleRun(
            "stock",
            "table...\n  flash sale lua / db_row_lock attempts/s = 29.20x >= 5x: PASS\n",
            12.0,
            {
                "reservations/s by processes": {
                    "lua": {1: 900.0, 8: 2400.0},
                    "db_row_lock": {1: 400.0, 8: 300.0},
                },
                "flash sale attempts/s": {"lua": 11800.0, "bare EVALSHA decrement": 31800.0},
            },
        ),  # fmt: skip
        report.ModuleRun(
            "locks",
            "  contended p99 >= 10x lower than redis-py: FAIL\n",
            8.0,
            {"lock handoff waits (ms)": {"ours": [0.3, 0.4, 2.0], "redis-py": [5.0, 90.0]}},
        ),
    ]
    path = report.write(runs, 20.0, tmp_path)
    text = path.read_text()
    assert "- `stock`:" in text and "29.20x >= 5x: PASS" in text
    assert "- `locks`:" in text and "FAIL" in text
    assert "### `stock` (12 s)" in text and "table..." in text
    for png in ("reservations.png", "flash_sale.png", "lock_waits.png"):
        assert f"]({png})" in text
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "delay_lateness.png").exists()  # no figures, no plot
