"""A small non-demo app whose delay-queue handlers are found only by discovery.

Nothing imports ``tests.delayapp.delay_handlers``: a process set up with
``tests.delayapp.settings`` (the suite's settings plus this app) knows its
handlers because stock_locks imports every installed app's ``delay_handlers``
module when Django is ready.
"""
