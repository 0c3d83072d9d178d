"""Gunicorn settings for gunicorn_app.py: one fresh sidecar connection per worker.

The ratekeeper client reconnects by itself after fork, so this hook is only
needed to make the reconnect explicit (e.g. to name each worker in the
sidecar's logs).
"""

import gunicorn_app

import ratekeeper

workers = 4
preload_app = True


def post_fork(server, worker):
    gunicorn_app.limiter = ratekeeper.Client(
        name=f"gunicorn-worker pid={worker.pid}", on_unavailable="allow"
    )
