"""The Celery example with a per-process limiter (`_per_process.py`) in each child.

`celery -A _per_process_celery worker ...` with this directory on PYTHONPATH
and the examples' as the worker's directory: the example's own
`worker_process_init` handler runs first, then this one replaces its client.
"""

from __future__ import annotations

import celery_app
import openai
from celery.signals import worker_process_init

from _per_process import PerProcessOpenAI

app = celery_app.app


@worker_process_init.connect
def limit_per_process(**_):
    celery_app.llm = PerProcessOpenAI(openai.OpenAI())
