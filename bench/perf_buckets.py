"""Where a daemon's CPU went, from `perf script` output of a
`perf record -g --call-graph dwarf` profile: every sample goes to one
bucket, by the first rule its stack (leaf first) matches. Prints a Markdown
table of the buckets' shares; see bench/PROFILE.md.

Usage: perf script -i perf.data | python3 bench/perf_buckets.py"""

import collections
import sys

# (bucket, any of these substrings in a frame), tried in order on each frame
# from the leaf up; the first frame that matches a rule decides.
LEAF_RULES = [
    ("allocator (mimalloc)", ("mi_", "_mi_")),
    (
        "kernel: socket read/write",
        (
            "unix_stream",
            "sock_",
            "__sys_recv",
            "__sys_send",
            "sys_read",
            "sys_write",
            "ksys_read",
            "ksys_write",
        ),
    ),
    (
        "kernel: epoll, futex, scheduling",
        ("epoll", "futex", "schedule", "finish_task_switch", "try_to_wake_up", "_raw_spin"),
    ),
]
OWNER_RULES = [
    ("Redis store: batching, script arguments, replies", ("ratekeeper::limiter::redis",)),
    ("redis crate: connection tasks, RESP", ("redis::",)),
    (
        "service: acquire, leases, metrics",
        (
            "ratekeeper::service",
            "ratekeeper::leases",
            "ratekeeper::metrics",
            "ratekeeper::limiter",
            "ratekeeper::plan",
        ),
    ),
    (
        "connection: frames, codec, dispatch, writes",
        ("ratekeeper::server", "ratekeeper::proto", "bincode"),
    ),
]


def classify(frames):
    for bucket, needles in LEAF_RULES:
        if frames and any(n in frames[0] for n in needles):
            return bucket
    if frames and "[kernel" in frames[0]:
        return "kernel: other"
    for frame in frames:
        for bucket, needles in OWNER_RULES:
            if any(n in frame for n in needles):
                return bucket
    return "tokio runtime: scheduler, timers, I/O driver"


def main():
    counts = collections.Counter()
    frames = None
    for line in sys.stdin:
        if not line.strip():
            if frames is not None:
                counts[classify(frames)] += 1
            frames = None
        elif line[0] not in " \t":
            frames = []
        elif frames is not None:
            frames.append(line.strip())
    if frames:
        counts[classify(frames)] += 1
    total = sum(counts.values())
    print(f"| bucket | share of {total} samples |")
    print("| --- | ---: |")
    for bucket, n in counts.most_common():
        print(f"| {bucket} | {100 * n / total:.1f} % |")


if __name__ == "__main__":
    main()
