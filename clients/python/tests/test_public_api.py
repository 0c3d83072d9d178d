"""The names the public modules export, pinned (issue 29).

The package is laid out by layer behind four public modules; moving code
between the private ones must not change what users import. Each module's
`__all__` is written out here in full, so a name that disappears (or one
added without meaning to) fails this test instead of a user's import.
"""

from __future__ import annotations

import importlib

import pytest

#: Every name `from <module> import *` gives, per public module.
EXPORTED = {
    "ratekeeper": {
        "DEFAULT_SOCKET",
        "ENV_SOCKET",
        "ERROR_CLASSES",
        "AsyncClient",
        "AsyncLease",
        "BucketStatus",
        "BudgetExhausted",
        "BudgetStatus",
        "Cancelled",
        "ChatMessage",
        "Client",
        "CostExceedsCapacity",
        "DuplicateRequestId",
        "ErrorCode",
        "Estimated",
        "FrameTooLarge",
        "HelloRequired",
        "InternalError",
        "InvalidRequest",
        "Lease",
        "LimitStatus",
        "MalformedMessage",
        "Overloaded",
        "ProtocolError",
        "RateLimited",
        "RatekeeperError",
        "ShuttingDown",
        "SidecarUnavailable",
        "SidecarUnavailableWarning",
        "StatusReply",
        "StoreUnavailable",
        "TooManyInFlight",
        "UnknownErrorCode",
        "UnknownLease",
        "UnknownLimit",
        "UnknownPriority",
        "Unsupported",
        "UnsupportedVersion",
        "estimate_prompt_tokens",
    },
    "ratekeeper.openai": {"LimitOptions", "retry_delay", "wrap"},
    "ratekeeper.anthropic": {"LimitOptions", "wrap"},
    "ratekeeper.retry": {"is_retryable", "retry_after", "retry_if_retryable", "wait_retry_after"},
}

#: Names outside `__all__` that users are told to import.
ALSO_PUBLIC = {
    "ratekeeper": {"__version__"},
    "ratekeeper.openai": {"FALLBACK_MAX_TOKENS"},
}


@pytest.mark.parametrize("module", sorted(EXPORTED))
def test_the_exported_names_are_pinned(module):
    exported = importlib.import_module(module).__all__
    assert len(exported) == len(set(exported)), "a name is listed twice"
    assert set(exported) == EXPORTED[module]


@pytest.mark.parametrize("module", sorted(EXPORTED))
def test_every_public_name_resolves(module):
    imported = importlib.import_module(module)
    missing = {
        name
        for name in EXPORTED[module] | ALSO_PUBLIC.get(module, set())
        if not hasattr(imported, name)
    }
    assert not missing
