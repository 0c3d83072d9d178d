"""Gunicorn settings for gunicorn_app.py: the app preloaded, one named sidecar client per worker.

Gunicorn reads this file before `--chdir` applies, so nothing here imports
the app at load time; `post_fork` runs in each worker, after the app was
loaded from the `--chdir` directory.
"""

preload_app = True


def post_fork(server, worker):
    import gunicorn_app

    gunicorn_app.connect(name=f"gunicorn-worker pid={worker.pid}")
