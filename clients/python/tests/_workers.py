"""Worker bodies run in other processes by the concurrency tests (importable by spawn)."""

from __future__ import annotations

import threading
import time

from ratekeeper import Client, RateLimited


def hammer(socket: str, limit: str, threads: int, duration: float, tokens: int, barrier, results):
    """`threads` threads acquire `tokens` at a time until `duration` has passed.

    A denial is answered by waiting its `retry_after` (bounded by the end). Puts
    one dict on `results`: counts, granted tokens, wall-clock times of the first
    request sent and of the last grant received, and any unexpected errors.
    """
    client = Client(socket, timeout=10)
    client.ping()
    barrier.wait(timeout=30)
    end = time.monotonic() + duration
    lock = threading.Lock()
    totals = {"granted": 0, "denied": 0, "tokens": 0, "errors": [], "last_grant": 0.0}
    first_sent = time.time()

    def work() -> None:
        while time.monotonic() < end:
            try:
                lease = client.acquire(limit, tokens, max_wait=0.2)
            except RateLimited as denied:
                with lock:
                    totals["denied"] += 1
                time.sleep(max(0.0, min(denied.retry_after, end - time.monotonic())))
                continue
            except Exception as error:
                with lock:
                    totals["errors"].append(repr(error))
                return
            received = time.time()
            lease.report(tokens)  # all used: nothing comes back to the bucket
            with lock:
                totals["granted"] += 1
                totals["tokens"] += lease.tokens
                totals["last_grant"] = max(totals["last_grant"], received)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    totals["first_sent"] = first_sent
    client.close()
    results.put(totals)
