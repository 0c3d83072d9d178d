"""Sockets in front of the real daemon that answer some requests in its
place: `Proxy` passes every frame through whole, in both directions, but
those its `answer_instead` answers; `OlderProxy` plays an older daemon: it
records every request the client sends and answers the requests of a newer
protocol revision as a daemon that predates them does (PROTOCOL.md §10)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from ratekeeper import _proto as p


def _frames(sock: socket.socket) -> Iterator[bytes]:
    """The whole frames (length prefix and payload) read from `sock`, until it closes."""
    buffer = b""
    while True:
        data = sock.recv(65536)
        if not data:
            return
        buffer += data
        while len(buffer) >= p.LENGTH_PREFIX_LEN:
            end = p.LENGTH_PREFIX_LEN + int.from_bytes(buffer[: p.LENGTH_PREFIX_LEN], "little")
            if len(buffer) < end:
                break
            yield buffer[:end]
            buffer = buffer[end:]


class Proxy:
    """A socket at `directory/proxy.sock` in front of the daemon at `upstream`.

    Every frame goes through whole, in both directions, but a request that
    `answer_instead` answers: that answer goes to the client, and the
    request never reaches the daemon.
    """

    def __init__(self, upstream: str, directory: Path) -> None:
        self.upstream = upstream
        self.path = str(directory / "proxy.sock")
        self._sockets: list[socket.socket] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(8)
        threading.Thread(target=self._accept, daemon=True).start()

    def answer_instead(self, request_id: int, request: p.Request) -> Optional[p.ServerFrame]:
        """The answer to give in the daemon's place, or None to pass the request on."""
        return None

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                daemon.connect(self.upstream)
            except OSError:
                return  # closed
            self._sockets += [client, daemon]
            to_client = threading.Lock()  # answers and refusals never interleave
            threading.Thread(
                target=self._answers, args=(daemon, client, to_client), daemon=True
            ).start()
            threading.Thread(
                target=self._requests, args=(client, daemon, to_client), daemon=True
            ).start()

    @staticmethod
    def _answers(daemon: socket.socket, client: socket.socket, to_client: threading.Lock) -> None:
        with contextlib.suppress(OSError):
            for frame in _frames(daemon):
                with to_client:
                    client.sendall(frame)
            client.shutdown(socket.SHUT_WR)

    def _requests(
        self, client: socket.socket, daemon: socket.socket, to_client: threading.Lock
    ) -> None:
        with contextlib.suppress(OSError):
            for frame in _frames(client):
                message = p.decode_payload(frame[p.LENGTH_PREFIX_LEN :], p.ClientFrame)
                answer = self.answer_instead(message.request_id, message.request)
                if answer is not None:
                    with to_client:
                        client.sendall(p.encode_frame(answer))
                    continue
                daemon.sendall(frame)
            daemon.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class OlderProxy(Proxy):
    """A proxy that records every request and, while `refuse_with` is an
    error code, answers each request of a kind in `refused` (`UsageReport`
    unless told otherwise) with it, as a daemon of revision 5
    (`Unsupported`) or 0.1 (`MalformedMessage`) does."""

    def __init__(
        self, upstream: str, directory: Path, refused: tuple[type, ...] = (p.UsageReport,)
    ) -> None:
        self.refused = refused
        self.refuse_with: Optional[int] = None
        #: Every request the client sent, in order.
        self.requests: list[p.Request] = []
        super().__init__(upstream, directory)

    def sent(self, kind: type) -> list:
        """The requests of type `kind` the client sent."""
        return [request for request in self.requests if type(request) is kind]

    def answer_instead(self, request_id: int, request: p.Request) -> Optional[p.ServerFrame]:
        self.requests.append(request)
        if type(request) not in self.refused or self.refuse_with is None:
            return None
        refusal = p.ErrorReply(self.refuse_with, f"request tag {request.TAG} is not known")
        return p.ServerFrame(request_id, refusal)
