"""What both SDK wrappers share, whatever the provider: the wrapped client, its
namespaces, and the view of each resource whose calls are limited.

`WrappedClient` holds the SDK client (and its copy without retries), the
limiter, the settings and the gate every limited call goes through; it copies
itself with `with_options`, and passes every other attribute through to the
SDK client, warning once for those that spend tokens unlimited.
`WrappedNamespace` does the same for a namespace of it (`chat`, `beta`).
`LimitedView` is one limited resource (`chat.completions`, `messages`, ...):
the provider's subclass limits its calls; `with_raw_response` and
`with_streaming_response` (`PrefixedCalls`) limit the same
calls there and pass the rest through, warning the same way.

Nothing here waits: the same classes serve the blocking and the asyncio
wrappers, whose calls are the providers' modules' (`_async/openai.py`,
`_async/anthropic.py` and their generated `_sync` twins).
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Any, Callable, ClassVar, Optional, Protocol


class Endpoint(Protocol):
    """A resource a wrapper limits (the OpenAI wrapper's `Api`, the Anthropic
    wrapper's `Endpoint`)."""

    @property
    def path(self) -> str:
        """Where it is in the SDK client, dotted: "chat.completions", "beta.messages"."""

    @property
    def methods(self) -> frozenset:
        """Its methods that are limited, also under `with_raw_response` and
        `with_streaming_response`."""

    @property
    def unlimited(self) -> frozenset:
        """Its other methods that spend tokens unlimited: reaching one warns once."""


def without_retries(client: Any) -> Any:
    """The SDK client with its own retries off, so that a provider's 429 is
    never retried behind the limiter's back."""
    with_options = getattr(client, "with_options", None)
    return with_options(max_retries=0) if callable(with_options) else client


def warn_unlimited(seen: set, path: str, provider: str) -> None:
    """Warns, once per `seen` set, that `path` of a wrapped `provider` client is
    not limited: a `RuntimeWarning` that names the line of the caller, the
    first frame outside this package, however deep in the wrapper the
    attribute was noticed."""
    if path in seen:
        return
    seen.add(path)
    warnings.warn(
        f"ratekeeper: {path} of a wrapped {provider} client is not rate-limited; "
        "acquire and report around these calls yourself (see ratekeeper.Client.acquire)",
        RuntimeWarning,
        stacklevel=_outside_this_package(),
    )


def _outside_this_package() -> int:
    """The `stacklevel` for a `warnings.warn` made by this function's caller
    that names the first frame outside the package (1 names the caller)."""
    package = __name__.partition(".")[0]  # ratekeeper, whatever the layer
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None:
        module = frame.f_globals.get("__name__", "")
        if module != package and not module.startswith(package + "."):
            break
        frame = frame.f_back
        level += 1
    return level


class WrappedClient:
    """A wrapped SDK client: its provider's subclass sets `gate` and the limited
    resources as attributes; everything else passes through to the SDK
    client, and what spends tokens there unlimited warns once."""

    #: The provider, as the warning names it.
    provider: ClassVar[str]
    #: The SDK client's attributes that spend tokens unlimited.
    unlimited: ClassVar[frozenset]

    def __init__(
        self,
        client: Any,
        limiter: Any,
        settings: Any,
        warned: Optional[set] = None,
    ) -> None:
        self._client = client
        self._raw = without_retries(client)
        self.limiter = limiter
        self.settings = settings
        #: The unlimited parts already warned about (shared with copies).
        self.warned: set = set() if warned is None else warned
        #: The rule every limited call goes through: the provider's subclass of
        #: `AsyncGate` or of `Gate` (`_async/gate.py`, `_sync/gate.py`).
        self.gate: Any = None

    def with_options(self, **options: Any) -> Any:
        """The SDK's `with_options` (also `copy`), limited like this client."""
        copied = self._client.with_options(**options)
        return type(self)(copied, self.limiter, self.settings, self.warned)

    copy = with_options

    def warn_unlimited(self, path: str) -> None:
        """Warns once that `path` of this client spends tokens unlimited."""
        warn_unlimited(self.warned, path, self.provider)

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._client, name)
        if name in self.unlimited:
            self.warn_unlimited(name)
        return found


class WrappedNamespace:
    """A namespace of a wrapped client (`chat`, `beta`) whose limited resources
    are given as keywords; the rest passes through to the SDK's namespace, and
    what spends tokens there unlimited warns once."""

    def __init__(
        self, wrapped: WrappedClient, name: str, unlimited: frozenset, **limited: LimitedView
    ) -> None:
        self._wrapped = wrapped
        self._name = name
        self._unlimited = unlimited
        self.__dict__.update(limited)

    def __getattr__(self, name: str) -> Any:
        found = getattr(getattr(self._wrapped._client, self._name), name)
        if name in self._unlimited:
            self._wrapped.warn_unlimited(f"{self._name}.{name}")
        return found


class LimitedView:
    """A resource of a wrapped client whose `endpoint.methods` are limited.

    The provider's subclass defines them, with `_raw(method, **kwargs)` (the
    limited `with_raw_response.<method>`) and `_streaming(method, **kwargs)`
    (the limited `with_streaming_response.<method>`: a context manager).
    Everything else passes through to the SDK's resource; what spends tokens
    there unlimited warns once.
    """

    def __init__(self, wrapped: WrappedClient, endpoint: Endpoint) -> None:
        self._wrapped = wrapped
        self._endpoint = endpoint
        self._gate: Any = wrapped.gate

    def _sdk(self, client: Any) -> Any:
        """This resource in `client` (the wrapped client, or its copy without retries)."""
        for name in self._endpoint.path.split("."):
            client = getattr(client, name)
        return client

    def _unlimited(self, name: str, prefix: str = "") -> None:
        """Warns once if `name` (of the view `prefix`) spends tokens unlimited."""
        if name in self._endpoint.unlimited:
            self._wrapped.warn_unlimited(f"{self._endpoint.path}.{prefix}{name}")

    def _raw(self, method: str, /, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _streaming(self, method: str, /, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._sdk(self._wrapped._client), name)
        self._unlimited(name)
        return found

    @property
    def with_raw_response(self) -> PrefixedCalls:
        """The SDK's `with_raw_response`, with the same calls limited."""
        return PrefixedCalls(self, "with_raw_response", self._raw)

    @property
    def with_streaming_response(self) -> PrefixedCalls:
        """The SDK's `with_streaming_response`, with the same calls limited."""
        return PrefixedCalls(self, "with_streaming_response", self._streaming)


class PrefixedCalls:
    """`with_raw_response` or `with_streaming_response` of a limited resource
    (the SDK attribute `prefix`): its limited calls go to `limited` (the
    view's `_raw`, which answers the SDK's raw response settled from the
    parsed usage, or its `_streaming`, a context manager that settles when
    it is left); the rest pass through, warning once."""

    def __init__(self, view: LimitedView, prefix: str, limited: Callable[..., Any]) -> None:
        self._view = view
        self._prefix = prefix
        self._limited = limited

    def __getattr__(self, name: str) -> Any:
        view = self._view
        found = getattr(getattr(view._sdk(view._wrapped._client), self._prefix), name)
        if name in view._endpoint.methods:
            return functools.partial(self._limited, name)
        view._unlimited(name, f"{self._prefix}.")
        return found
