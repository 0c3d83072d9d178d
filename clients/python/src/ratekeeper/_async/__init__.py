"""The code that waits, written once for asyncio: the client and the SDK wrappers.

- `client`: `AsyncClient`, the policy of a call (acquire, retries,
  reconnects, unavailability, abandon, the `limit` decorator);
- `lease`: `AsyncLease`, settling a lease;
- `gate`: the rule of a limited call, for every SDK wrapper;
- `openai`, `anthropic`: each wrapper's limited calls and wrapped client;
- `transport`: what it waits on (connection, slot, sleep), written by hand.

`scripts/unasync.py` generates the package `_sync` from this one, every
module but the transport, whose blocking twin is written by hand with the
same names and signatures.
"""
