"""gunicorn's settings for the demo shop, as a production deployment would have them.

``manage.py demo`` starts gunicorn with this file (``gunicorn -c
demo_shop/gunicorn.conf.py``); the bind address, workers and threads come from
its flags, which override what is here. Settings: https://docs.gunicorn.org/en/stable/settings.html
"""

# Threads make gunicorn's gthread worker (the sync worker keeps no connection alive):
# a request takes a thread, an idle kept-alive connection only a place in its poller.
worker_class = "gthread"
threads = 4

# Seconds an idle kept-alive connection stays open. The client (a load balancer's
# upstream pool, a requests.Session, a Locust user) must be the side that closes an idle
# connection, so this is longer than its idle timeout (60 s for a typical balancer). With
# gunicorn's 2 s default a pooled client's request sent as the server closed the
# connection failed with a reset (issue 23, item 8).
keepalive = 75

timeout = 120  # seconds a worker may be silent before the arbiter restarts it
graceful_timeout = 5  # seconds a stopping worker has to finish its requests
