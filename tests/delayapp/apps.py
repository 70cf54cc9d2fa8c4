from django.apps import AppConfig


class DelayAppConfig(AppConfig):
    name = "tests.delayapp"
    label = "tests_delayapp"
    verbose_name = "Delay-queue test handlers"
