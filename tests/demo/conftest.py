"""The demo shop's tests run on the demo's settings (tests/demo/settings.py).

Every test here sees the demo's STOCK_LOCKS (``shop.Product``), URLs and shop
settings, and so does every process it spawns (``DJANGO_SETTINGS_MODULE`` is
the demo's for the test's duration: tests/support hands it to children).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import override_settings

from tests.demo.settings import DEMO

SETTINGS_MODULE = "tests.demo.settings"


@pytest.fixture(autouse=True)
def demo_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", SETTINGS_MODULE)
    with override_settings(**DEMO):
        yield
