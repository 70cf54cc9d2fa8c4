"""The suite's settings plus ``tests.delayapp``: for drainer processes the tests start."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.delayapp"]
