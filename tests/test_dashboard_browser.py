"""The admin dashboard in a real browser: headless Chromium driven by Playwright.

Every page is served under a strict Content-Security-Policy (``default-src
'self'; script-src 'self'; style-src 'self'``, what Django 6's CSP gives a
project that allows only its own files): no inline script or style may run.
Console errors, uncaught exceptions and CSP violations are collected and must
be none.

A staff user (not a superuser) with the dashboard's two permissions logs in
through the admin login form and sees a lock held by another OS process (its
pid and fence), a semaphore holder, a dead letter and a drifting SKU. With
JavaScript on, the page refreshes its tables from the JSON endpoint without
reloading (and renders them as the server did); with JavaScript off, the page
is complete as served and the search and the force release through the
confirm page work. The audit row is checked in the database.

The browser is Debian's Chromium (``STOCK_LOCKS_CHROMIUM``, default
``/usr/bin/chromium``; ``scripts/setup.sh`` installs it), never a browser
downloaded by Playwright. A full-page screenshot goes to
``artifacts/dashboard.png``; with ``STOCK_LOCKS_UPDATE_DOCS=1`` it is also
copied to ``docs/dashboard.png``, the picture in docs/operations.md.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import override_settings
from django.urls import reverse
from playwright.sync_api import Page, Response, expect, sync_playwright

from tests.support import csp
from tests.support.lock_state import held
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

# Reports every CSP violation of every document to the test (Playwright
# injects init scripts outside the page's policy; with JavaScript off they do
# not run, and Chromium's console error is what reports a violation).
REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (e) => window.slReportViolation(
  `${e.effectiveDirective} blocked ${e.blockedURI || "inline"}`
  + ` at ${e.sourceFile}:${e.lineNumber}`));
"""

# The dashboard's tables as data: per table, per body row, its data-* and
# class attributes and per cell its class, text and links (as path plus
# sorted query parameters, so that two spellings of one URL compare equal).
# Cells marked sl-lease (a lease counting down) are compared by presence only.
# Reads the live document, or the HTML given, parsed without running anything.
READ_TABLES = """(html) => {
  const doc = html === null ? document : new DOMParser().parseFromString(html, "text/html");
  const text = (node) => node.textContent.replace(/\\s+/g, " ").trim();
  const link = (a) => {
    const url = new URL(a.getAttribute("href"), document.baseURI);
    const params = [...url.searchParams.entries()].sort().map(([k, v]) => `${k}=${v}`);
    return `${text(a)} -> ${url.pathname}?${params.join("&")}`;
  };
  const attrs = (el) => [...el.attributes].filter((a) => a.name === "class" ||
    a.name.startsWith("data-")).map((a) => `${a.name}=${a.value}`).sort();
  const tables = {};
  for (const table of doc.querySelectorAll("#content-main table")) {
    tables[table.id] = [...table.tBodies[0].rows].map((tr) => ({
      attrs: attrs(tr),
      cells: [...tr.cells].map((td) => td.classList.contains("sl-lease") ? "(lease)" :
        {attrs: attrs(td), colspan: td.colSpan, text: text(td),
         links: [...td.querySelectorAll("a")].map(link)}),
    }));
  }
  for (const id of ["sl-lock-total", "sl-lock-pages", "sl-drifting", "sl-sum-units", "sl-sum-paid",
                    "sl-sum-refused", "sl-sum-errors", "sl-sum-locks", "sl-sum-permits",
                    "sl-sum-waiting", "sl-sum-due", "sl-sum-dead", "sl-sum-drifting"]) {
    tables[id] = text(doc.getElementById(id));
  }
  return tables;
}"""

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


@pytest.fixture(scope="module")
def csp_server() -> Iterator[Any]:
    """A live server (pytest-django's, static files served) whose every response
    carries the strict policy: its handler loads the middleware when it starts."""
    from pytest_django.live_server_helper import LiveServer

    with override_settings(MIDDLEWARE=csp.with_strict_csp(settings.MIDDLEWARE)):
        server = LiveServer("localhost")
    yield server
    server.stop()


@contextmanager
def browser_page(executable: str, *, javascript: bool = True) -> Iterator[tuple[Page, list[str]]]:
    """A page in a fresh headless Chromium, 1280x900, en-GB, UTC, and the list
    of problems it reports as it runs (console errors, uncaught exceptions,
    CSP violations).

    Playwright's sync API runs an asyncio loop in this thread, and Django then
    refuses ORM calls here (SynchronousOnlyOperation): use the database before
    and after this block, not inside it.
    """
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_ARGS
        )
        try:
            context = browser.new_context(
                viewport={"width": 1280, "height": 900},
                locale="en-GB",
                timezone_id="UTC",
                java_script_enabled=javascript,
            )
            context.expose_binding(
                "slReportViolation", lambda _source, text: problems.append(f"CSP: {text}")
            )
            context.add_init_script(script=REPORT_VIOLATIONS)
            # The test site has no favicon; its 404 would be a console error.
            context.route("**/favicon.ico", lambda route: route.fulfill(status=204))
            page = context.new_page()
            page.on(
                "console",
                lambda message: (
                    message.type == "error" and problems.append(f"console: {message.text}")
                ),
            )
            page.on("pageerror", lambda error: problems.append(f"uncaught: {error}"))
            page.set_default_timeout(TIMEOUT * 1000)
            try:
                yield page, problems
            except BaseException:
                print("problems the page reported:", *problems, sep="\n  ")
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


@pytest.fixture
def other_sections(redis_client) -> Iterator[None]:
    """A semaphore holder, a delay queue with a dead letter, a drifting SKU, and a
    waiting room."""
    from stock_locks import DelayQueue, Semaphore
    from stock_locks.keys import StockKeys
    from tests.inventory.models import Item

    keys = StockKeys()
    for code, title, on_hand, counter in [
        ("KETTLE", "Kettle", 5, 7),  # Redis says 7, the database 5: drift +2
        ("MUG", "Mug", 40, 40),
        ("TEAPOT", "Teapot", 12, 12),
    ]:
        Item.objects.create(code=code, title=title, on_hand=on_hand)
        redis_client.set(keys.counter(code), counter)

    # A waiting room closed by sold out, three visitors in it (no admission: its figures
    # stay as they are between the page and the script's refresh).
    import datetime as dt

    from stock_locks.models import Event
    from stock_locks.waitingroom import WaitingRoom
    from stock_locks.waitingroom.spec import spec_of

    event = Event.objects.create(
        name="Kettle sale", slug="kettle-sale", max_active=2,
        start=dt.datetime(2020, 1, 1, tzinfo=dt.UTC),
    )  # fmt: skip
    for visitor in ("a", "b", "c"):
        WaitingRoom(spec_of(event)).visit(visitor, remaining=0)

    # A sale under way: units paid for, some held, some refused (the summary and the charts).
    from stock_locks import metrics
    from stock_locks.exceptions import OutOfStock
    from stock_locks.stock import get_strategy

    Item.objects.create(code="PAN", title="Pan", on_hand=12)
    lua = get_strategy("lua")
    for n in range(14):
        try:
            lua.reserve(f"pan-{n}", {"PAN": 1})
        except OutOfStock:
            continue
        if n % 3:
            lua.commit(f"pan-{n}")
    assert metrics.flush()

    queue = DelayQueue("default", max_attempts=1)  # no handler: dead at once
    queue.schedule("shop.no_such_task", {"order": 7})  # due now, handled by nobody
    queue.schedule("shop.expire_order", {"order": 8}, delay=600)
    result = queue.drain()
    assert result.dead == 1, result

    exports = Semaphore("exports", 3, ttl=300, caller="tests.export_orders")
    assert exports.acquire(timeout=0)
    yield
    exports.release()


def log_in(page: Page, base_url: str, dashboard_url: str, operator: User) -> Response:
    """Log in through the real admin form, which sends us on to the dashboard: its response."""
    page.goto(f"{base_url}{reverse('admin:login')}?next={dashboard_url}")
    page.fill("#id_username", operator.username)
    page.fill("#id_password", PASSWORD)
    with page.expect_response(lambda response: response.url == dashboard_url) as landed:
        page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(dashboard_url)
    assert landed.value.headers["content-security-policy"] == csp.POLICY
    return landed.value


def expect_every_section(page: Page, pid: int, fence: str) -> None:
    """The lock of the holder process, the semaphore, the dead letter, the stock drift."""
    row = page.locator(f'#sl-locks tr[data-lock="{LOCK}"]')
    expect(row).to_be_visible()
    expect(row.locator("td").nth(1)).to_contain_text(f" / {pid} / ")
    expect(row.locator("td").nth(4)).to_have_text(fence)
    expect(row.get_by_role("link", name="Force release")).to_be_visible()
    expect(page.locator("#sl-lock-total")).to_have_text("1")
    semaphore = page.locator('#sl-semaphores tr[data-semaphore="exports"]')
    expect(semaphore).to_have_count(1)
    expect(semaphore).to_contain_text("tests.export_orders")
    expect(semaphore.get_by_role("link", name="Evict")).to_be_visible()
    expect(page.locator('#sl-queues tr[data-queue="default"]')).to_have_count(1)
    room = page.locator('#sl-rooms tr[data-room="kettle-sale"]')
    expect(room.locator("td").nth(1)).to_have_text("sold out")
    expect(room.locator("td").nth(2)).to_have_text("3")
    dead = page.locator("#sl-dead tr[data-dead]")
    expect(dead).to_contain_text("shop.no_such_task")
    expect(dead.get_by_role("link", name="Requeue")).to_be_visible()
    expect(dead.get_by_role("link", name="Discard")).to_be_visible()
    expect(page.locator('#sl-stock tr[data-sku="KETTLE"]')).to_have_class("sl-drift")
    expect(page.locator('#sl-stock tr[data-sku="MUG"]')).not_to_have_class("sl-drift")
    expect(page.locator("#sl-drifting")).to_have_text("1")
    expect(page.get_by_role("link", name=re.compile("^Reconcile"))).to_be_visible()
    # The first screen (1280x900): the summary strip and the sale's progress per SKU.
    expect(page.locator("#sl-sum-units")).to_have_text("12")
    expect(page.locator("#sl-sum-paid")).to_have_text("8")
    expect(page.locator("#sl-sum-refused")).to_have_text("2")
    expect(page.locator("#sl-sum-drifting")).to_have_text("1")
    expect(page.locator('#sl-stock tr[data-sku="PAN"]')).to_contain_text("8 of 12 sold, 4 reserved")
    for above_the_fold in ["#sl-summary", '#sl-stock tr[data-sku="PAN"]', "#sl-processes"]:
        box = page.locator(above_the_fold).bounding_box()
        assert box is not None and box["y"] + box["height"] <= 900, (above_the_fold, box)


def refreshes(page: Page) -> int:
    """How many times the page's script has refreshed the tables from the JSON endpoint."""
    return int(page.locator("#content-main").get_attribute("data-refreshes") or 0)


def wait_for_refresh(page: Page) -> None:
    done = refreshes(page)
    page.wait_for_function(
        "n => Number(document.getElementById('content-main').dataset.refreshes || 0) > n",
        arg=done,
    )


def force_release_through_the_confirm_page(
    page: Page, dashboard_url: str, pid: int, fence: str
) -> None:
    """Confirm page names the holder; yes; back on the dashboard with a message."""
    row = page.locator(f'#sl-locks tr[data-lock="{LOCK}"]')
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


def confirm_field(details, name: str):
    """The value cell of row ``name`` in the confirm page's details table."""
    header = details.page.locator("th", has_text=re.compile(rf"^{name}$"))
    return details.locator("tr").filter(has=header).locator("td")


def check_force_release_audited(redis_client, operator: User, pid: int, fence: str) -> None:
    from stock_locks.keys import lock_keys
    from stock_locks.models import AuditEntry

    assert held(redis_client, lock_keys(LOCK).lock) == 0
    entry = AuditEntry.objects.get()
    assert entry.user == operator
    assert entry.username == "operator"
    assert entry.action == "release_lock"
    assert entry.target == LOCK
    assert entry.displaced["pid"] == str(pid)
    assert entry.displaced["fence"] == fence
    assert "force-released" in entry.outcome


def test_under_a_strict_csp_the_script_refreshes_the_tables_and_force_release_works(
    chromium, csp_server, operator, holder, other_sections, redis_client
):
    from stock_locks import Lock
    from stock_locks.dashboard import lock_holder

    pid, release_holder = holder
    fence = lock_holder(LOCK)["fence"]
    second = Lock("cart:alice", ttl=300, caller="tests.checkout")
    dashboard_url = csp_server.url + reverse("admin:stock_locks_dashboard")
    expect.set_options(timeout=TIMEOUT * 1000)

    try:
        with browser_page(chromium) as (page, problems):
            log_in(page, csp_server.url, dashboard_url, operator)
            expect_every_section(page, pid, fence)
            run_live_page(page, dashboard_url, pid, fence, second)
            assert problems == []
    finally:
        release_holder.set()
        if second.owned():
            second.release()
    check_force_release_audited(redis_client, operator, pid, fence)


def run_live_page(page: Page, dashboard_url: str, pid: int, fence: str, second) -> None:
    """With JavaScript on (no ORM in here: see browser_page)."""
    # The script renders the JSON as the server rendered the HTML: same rows,
    # cells, classes and links (a lease counting down aside).
    served = page.request.get(dashboard_url)
    assert served.headers["content-security-policy"] == csp.POLICY
    wait_for_refresh(page)
    assert page.evaluate(READ_TABLES, None) == page.evaluate(READ_TABLES, served.text())

    # It refreshes from the JSON endpoint: a new lock shows up without a
    # reload (the marker set on this document survives).
    page.evaluate("window.slNotReloaded = true")
    assert second.acquire(timeout=0)
    expect(page.locator('#sl-locks tr[data-lock="cart:alice"]')).to_be_visible()
    expect(page.locator("#sl-lock-total")).to_have_text("2")
    assert page.evaluate("window.slNotReloaded") is True
    # The charts are swapped in by the refresh too (server-drawn SVG, no CSP violation),
    # and that acquire, flushed to the timeline, is on the lock-wait chart.
    wait_for_refresh(page)
    expect(page.locator(".sl-chart svg")).to_have_count(6)
    tops = [page.locator(".sl-chart").nth(i).bounding_box()["y"] for i in range(3)]
    assert tops[0] == tops[1] == tops[2], f"the charts are not in a grid: {tops}"
    expect(page.locator("#sl-chart-reservations svg polyline").first).to_be_attached()
    expect(page.locator("#sl-chart-lock-wait svg :is(polyline, circle)").first).to_be_attached()

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("STOCK_LOCKS_UPDATE_DOCS") == "1":
        shutil.copyfile(shot, DOCS_SCREENSHOT)

    force_release_through_the_confirm_page(page, dashboard_url, pid, fence)
    expect(page.locator('#sl-locks tr[data-lock="cart:alice"]')).to_be_visible()
    expect(page.locator("#sl-lock-total")).to_have_text("1")


def test_with_javascript_off_the_page_is_complete_and_force_release_works(
    chromium, csp_server, operator, holder, other_sections, redis_client
):
    from stock_locks.dashboard import lock_holder

    pid, release_holder = holder
    fence = lock_holder(LOCK)["fence"]
    dashboard_url = csp_server.url + reverse("admin:stock_locks_dashboard")
    expect.set_options(timeout=TIMEOUT * 1000)

    try:
        with browser_page(chromium, javascript=False) as (page, problems):
            log_in(page, csp_server.url, dashboard_url, operator)
            expect_every_section(page, pid, fence)
            run_static_page(page, dashboard_url, pid, fence)
            assert problems == []
    finally:
        release_holder.set()
    check_force_release_audited(redis_client, operator, pid, fence)


def run_static_page(page: Page, dashboard_url: str, pid: int, fence: str) -> None:
    """With JavaScript off (no ORM in here: see browser_page)."""
    search = page.get_by_placeholder("name contains")
    search.fill("no such lock")
    search.press("Enter")
    expect(page.locator("#sl-locks tbody")).to_have_text("No held lock matches the search.")
    expect(page.locator("#sl-lock-total")).to_have_text("0")
    search = page.get_by_placeholder("name contains")
    search.fill("order:")
    search.press("Enter")
    expect(page).to_have_url(f"{dashboard_url}?q=order%3A")
    expect(page.locator(f'#sl-locks tr[data-lock="{LOCK}"]')).to_be_visible()

    # Sorting and the history window are links: they work without JavaScript.
    page.locator("#sl-stock thead").get_by_role("link", name="SKU").click()
    expect(page.locator("#sl-stock tbody tr").first).to_have_attribute("data-sku", "KETTLE")
    page.get_by_role("link", name="1h", exact=True).click()
    expect(page.locator("#sl-status ~ strong, p.sl-muted strong").first).to_have_text("1h")
    expect(page).to_have_url(re.compile(r"window=1h"))
    expect(page.locator("#sl-stock tbody tr").first).to_have_attribute("data-sku", "KETTLE")
    page.goto(dashboard_url)

    force_release_through_the_confirm_page(page, dashboard_url, pid, fence)
    expect(page.locator("#sl-lock-total")).to_have_text("0")
    expect(page.locator("#sl-locks tbody")).to_have_text("No lock is held.")
