"""The admin dashboard in a real browser: headless Chromium driven by Playwright.

A staff user (not a superuser) with the dashboard's two permissions logs in
through the admin login form, sees a lock held by another OS process (its pid
and fence), watches the page pick up a new lock without reloading, and
force-releases the first lock through the confirm page; the audit row is
checked in the database.

The browser is Debian's Chromium (``STOCK_LOCKS_CHROMIUM``, default
``/usr/bin/chromium``; ``scripts/setup.sh`` installs it), never a browser
downloaded by Playwright. A full-page screenshot goes to
``artifacts/dashboard.png``; with ``STOCK_LOCKS_UPDATE_DOCS=1`` it is also
copied to ``docs/dashboard.png``, the README's picture.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from playwright.sync_api import Page, expect, sync_playwright

from tests.support.processes import event, start_process
from tests.support.waiting import TIMEOUT

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
DOCS_SCREENSHOT = ROOT / "docs" / "dashboard.png"
CHROMIUM = os.environ.get("STOCK_LOCKS_CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium keeps dialling Google's hosts,
# which a closed network refuses; --no-sandbox because tests may run as root.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
PASSWORD = "a-long-test-password"
LOCK = "order:42"

pytestmark = pytest.mark.django_db(transaction=True)  # the live server reads what we write


def hold_lock(name: str, acquired, release) -> None:  # runs in another OS process
    """Hold lock ``name`` until ``release`` is set (or TIMEOUT runs out); never release it."""
    from stock_locks import Lock

    lock = Lock(name, ttl=300, caller="tests.hold_lock")
    assert lock.acquire(timeout=TIMEOUT)
    acquired.set()
    release.wait(TIMEOUT * 4)  # the test force-releases the lock, then sets this


@pytest.fixture
def chromium() -> str:
    if not os.path.isfile(CHROMIUM) or not os.access(CHROMIUM, os.X_OK):
        pytest.skip(
            f"no Chromium at {CHROMIUM} (run scripts/setup.sh, which installs Debian's "
            "chromium, or set STOCK_LOCKS_CHROMIUM)"
        )
    return CHROMIUM


@contextmanager
def browser_page(executable: str) -> Iterator[Page]:
    """A page in a fresh headless Chromium, 1280x900, en-GB, UTC.

    Playwright's sync API runs an asyncio loop in this thread, and Django then
    refuses ORM calls here (SynchronousOnlyOperation): use the database before
    and after this block, not inside it.
    """
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_ARGS
        )
        try:
            context = browser.new_context(
                viewport={"width": 1280, "height": 900}, locale="en-GB", timezone_id="UTC"
            )
            page = context.new_page()
            page.set_default_timeout(TIMEOUT * 1000)
            try:
                yield page
            except BaseException:
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "dashboard-failure.png"), full_page=True)
                raise
        finally:
            browser.close()


@pytest.fixture
def operator() -> User:
    """Staff, not superuser: only the dashboard's view and force permissions."""
    user = User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="stock_locks",
            codename__in=["view_dashboard", "force_release"],
        )
    )
    assert user.user_permissions.count() == 2
    assert not user.is_superuser
    return user


@pytest.fixture
def holder() -> Iterator[tuple[int, object]]:
    """Another OS process holding LOCK: (its pid, the event that lets it exit)."""
    acquired, release = event(), event()
    proc = start_process(hold_lock, LOCK, acquired, release)
    try:
        assert acquired.wait(TIMEOUT), (
            f"the holder process did not take {LOCK} (exit {proc.exitcode})"
        )
        yield proc.pid, release
    finally:
        release.set()
        proc.join(TIMEOUT)
        if proc.is_alive():
            proc.kill()
            proc.join()


def seed_other_sections(redis_client) -> None:
    """A semaphore holder, a delay queue with a dead letter, and a drifting SKU."""
    from demo_shop.shop.models import Product
    from stock_locks import DelayQueue
    from stock_locks.keys import StockKeys

    keys = StockKeys()
    for sku, name, stock, counter in [
        ("KETTLE", "Kettle", 5, 7),  # Redis says 7, the database 5: drift +2
        ("MUG", "Mug", 40, 40),
        ("TEAPOT", "Teapot", 12, 12),
    ]:
        Product.objects.create(sku=sku, name=name, price="9.50", stock=stock)
        redis_client.set(keys.counter(sku), counter)

    queue = DelayQueue("default")
    queue.schedule("shop.no_such_task", {"order": 7})  # due now, handled by nobody
    queue.schedule("shop.expire_order", {"order": 8}, delay=600)
    result = queue.drain()
    assert result.dead == 1, result


def test_dashboard_shows_refreshes_and_force_releases(
    chromium, live_server, operator, holder, redis_client
):
    from stock_locks import Lock, Semaphore
    from stock_locks.dashboard import lock_holder
    from stock_locks.keys import lock_keys
    from stock_locks.models import AuditEntry

    pid, release_holder = holder
    fence = lock_holder(LOCK)["fence"]
    seed_other_sections(redis_client)
    exports = Semaphore("exports", 3, ttl=300, caller="tests.export_orders")
    assert exports.acquire(timeout=0)
    second = Lock("cart:alice", ttl=300, caller="tests.checkout")
    dashboard_url = live_server.url + reverse("admin:stock_locks_dashboard")
    expect.set_options(timeout=TIMEOUT * 1000)

    try:
        with browser_page(chromium) as page:
            run_browser(page, live_server.url, dashboard_url, operator, pid, fence, second)
    finally:
        release_holder.set()
        if second.owned():
            second.release()
        exports.release()

    assert redis_client.exists(lock_keys(LOCK).lock) == 0
    entry = AuditEntry.objects.get()

    assert entry.user == operator
    assert entry.username == "operator"
    assert entry.action == "release_lock"
    assert entry.target == LOCK
    assert entry.displaced["pid"] == str(pid)
    assert entry.displaced["fence"] == fence
    assert "force-released" in entry.outcome


def confirm_field(details, name: str):
    """The value cell of row ``name`` in the confirm page's details table."""
    header = details.page.locator("th", has_text=re.compile(rf"^{name}$"))
    return details.locator("tr").filter(has=header).locator("td")


def run_browser(
    page: Page, base_url: str, dashboard_url: str, operator: User, pid: int, fence: str, second
) -> None:
    """Everything the browser does (no ORM in here: see browser_page)."""
    # Log in through the real admin form; it sends us on to the dashboard.
    page.goto(f"{base_url}{reverse('admin:login')}?next={dashboard_url}")
    page.fill("#id_username", operator.username)
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(dashboard_url)

    row = page.locator(f'#sl-locks tr[data-lock="{LOCK}"]')
    expect(row).to_be_visible()
    expect(row.locator("td").nth(1)).to_contain_text(f" / {pid} / ")
    expect(row.locator("td").nth(4)).to_have_text(fence)
    expect(page.locator("#sl-lock-total")).to_have_text("1")
    expect(page.locator('#sl-semaphores tr[data-semaphore="exports"]')).to_have_count(1)
    expect(page.locator("#sl-dead tr[data-dead]")).to_contain_text("shop.no_such_task")
    expect(page.locator('#sl-stock tr[data-sku="KETTLE"]')).to_have_class("sl-drift")
    expect(page.locator('#sl-stock tr[data-sku="MUG"]')).not_to_have_class("sl-drift")
    expect(page.locator("#sl-drifting")).to_have_text("1")

    # The page refreshes itself from the JSON endpoint: a new lock shows up
    # without a reload (the marker set on this document survives).
    page.evaluate("window.slNotReloaded = true")
    assert second.acquire(timeout=0)
    expect(page.locator('#sl-locks tr[data-lock="cart:alice"]')).to_be_visible()
    expect(page.locator("#sl-lock-total")).to_have_text("2")
    assert page.evaluate("window.slNotReloaded") is True

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("STOCK_LOCKS_UPDATE_DOCS") == "1":
        shutil.copyfile(shot, DOCS_SCREENSHOT)

    # Force release: confirm page names the holder, then back with a message.
    row.get_by_role("link", name="Force release").click()
    details = page.locator("#confirm-details")
    expect(confirm_field(details, "pid")).to_have_text(str(pid))
    expect(confirm_field(details, "fence")).to_have_text(fence)
    expect(confirm_field(details, "caller")).to_have_text("tests.hold_lock")
    page.get_by_role("button", name="Yes, I'm sure").click()
    expect(page).to_have_url(dashboard_url)
    expect(page.locator(".messagelist .success")).to_contain_text(
        re.compile(rf"lock '{LOCK}' force-released \(fence {fence}\)", re.IGNORECASE)
    )
    expect(row).to_have_count(0)
    expect(page.locator('#sl-locks tr[data-lock="cart:alice"]')).to_be_visible()
    expect(page.locator("#sl-lock-total")).to_have_text("1")
