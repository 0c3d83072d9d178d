"""What both clients share that never waits, on top of the codec (`_proto`).

- `settings`: the client's options (socket, expected uid, name, timeouts);
- `errors`: the failures the client detects itself (`RateLimited`,
  `SidecarUnavailable`, ...);
- `session`: the sans-IO state of one connection;
- `connecting`: what a connect attempt found, and the pauses between attempts;
- `deadlines`: a call's deadline, and when a settlement is sent again;
- `content` and `requests`: the public API's arguments as the wire's requests;
- `results`: answers as results or exceptions;
- `failed_call`: what a failed provider call leaves of its lease;
- `decorator`: what the `limit` decorator checks and counts;
- `estimate`: the client-side prompt estimate, for daemons that cannot count;
- `calls`, `wrapping`: what every SDK wrapper shares; `openai` and
  `anthropic`: each provider's calls, sans I/O.

The code that waits is in `_async` (written once) and `_sync` (generated
from it, but for its transport).
"""
