"""The admin dashboard with its Redis killed: the page, its JSON and the operator
actions answer 503 with a message, never a server error; an action the operator
confirmed is audited with its outcome not known (its request may have reached Redis)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from stock_locks import Lock
from stock_locks.models import AuditEntry
from tests.test_dashboard import PAGE, action_url, client_for

pytestmark = pytest.mark.django_db


def test_with_redis_down_the_page_and_its_actions_answer_503_and_actions_are_audited(
    redis_factory, use_redis
):
    server = redis_factory()
    use_redis(server)
    lock = Lock("order:7", ttl=60)
    assert lock.acquire()
    client = client_for(User.objects.create_superuser("root", password="pw"))
    server.stop()

    page = client.get(reverse(PAGE))
    assert page.status_code == 503 and b"Redis unavailable" in page.content
    data = client.get(reverse("admin:stock_locks_dashboard_json"))
    assert data.status_code == 503 and "Redis unavailable" in data.json()["error"]
    confirm = client.get(action_url("release_lock"), {"name": "order:7"})
    assert confirm.status_code == 503 and b"nothing done" in confirm.content
    assert not AuditEntry.objects.exists()  # only asked
    done = client.post(
        action_url("release_lock"), {"name": "order:7", "token": lock.token, "confirm": "yes"}
    )
    assert done.status_code == 503 and b"not known (audited)" in done.content
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.target) == ("release_lock", "order:7")
    assert entry.outcome.startswith("outcome not known")
