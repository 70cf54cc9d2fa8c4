"""The demo's fault tests: the fault suite's fixtures (tests/faults/conftest.py)."""

from tests.faults.conftest import fault_proxy, no_child_left, redis, redis_through_proxy

__all__ = ["fault_proxy", "no_child_left", "redis", "redis_through_proxy"]
