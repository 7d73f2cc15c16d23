"""uvicorn's configuration for `ramforge serve`: deadlines for reading each request and for a client
to take what is written to it, a bounded send buffer per connection, and a cap on open connections.

`_timed_h11` is uvicorn's h11 protocol with the guards uvicorn lacks:

- Read deadline: a client that does not send a whole request (headers and body) within
  `request_timeout` seconds of connecting or of its first byte after a response is disconnected.
  uvicorn's timeout_keep_alive only covers the idle time between requests: a client that
  connects and sends nothing, or part of the headers, or part of a body, is otherwise held open
  for good (and a partial body keeps its request task waiting in `receive()`).
- Write deadline: a client that takes nothing of a response for `write_timeout` seconds (the
  transport's buffer stays above its high-water mark: writing paused) is aborted. uvicorn's
  `send` otherwise waits for it forever, and with it a streamed generation holding the model
  lock or a slot; the abort is the client's `http.disconnect`, which stops the generation
  (ramforge.cancel) and frees the lock or the slot. The kernel's send buffer of each connection is
  held to `send_buffer` bytes: Linux grows a loopback connection's to 4 MiB, kernel memory outside
  any budget (x the connections) that a reader who stopped fills before its deadline can start.
- Connection cap: when a new connection makes more than `max_connections`, the connection that
  has waited longest for its (next) request is closed to make room: a flood of idle or
  slow-loris connections cannot lock others out, and stays bounded in descriptors. When every
  connection is in the middle of a request (uvicorn's limit_concurrency rule, at the cap + 1
  connections or requests), the new request is answered 503 in the server's JSON error shape
  (`_over_cap`), and its connection closed.
"""
from __future__ import annotations

import functools
import logging
import socket
import struct
import time

log = logging.getLogger("ramforge.server")

SEND_BUFFER = 128 << 10     # SO_SNDBUF of each connection (the kernel doubles it); Linux grows one to 4 MiB


def uvicorn_config(app, host: str = "127.0.0.1", port: int = 11434, *, timeout_keep_alive: float = 5.0,
                   request_timeout: float = 10.0, write_timeout: float = 30.0, max_connections: int | None = 256,
                   send_buffer: int | None = SEND_BUFFER, **kwargs):
    """uvicorn's Config for `app`, with a deadline for reading each request, one for writing each
    response (see `_timed_h11`), at most `max_connections` open connections (None: no cap), each
    with a send buffer of `send_buffer` bytes (None: the system's), and `timeout_keep_alive` seconds
    for an idle keep-alive connection."""
    import uvicorn

    cap = None if max_connections is None else int(max_connections)
    http = _timed_h11(float(request_timeout), float(write_timeout), cap, send_buffer)
    return uvicorn.Config(app, host=host, port=port, http=http, timeout_keep_alive=timeout_keep_alive, **kwargs)


def _over_cap(max_connections: int):
    """The ASGI app answering a request made over the connection cap: 503 in the server's JSON error shape
    (Ollama's, OpenAI's under /v1), with Retry-After, closing the connection (uvicorn's own answer is
    plain text)."""
    from .browser import send_error

    warned = [-1e9]

    async def over_cap(scope, receive, send):
        now = time.monotonic()
        if now - warned[0] >= 1.0:              # a flood logs once a second
            warned[0] = now
            log.warning("every connection is being served (--max-connections %d): a new request gets 503",
                        max_connections)
        await send_error(send, scope.get("path", ""), 503,
                         f"server busy: all {max_connections} connections (--max-connections) are being served; "
                         "retry later", [(b"retry-after", b"1"), (b"connection", b"close")])
    return over_cap


def _hold_send_buffer(transport, send_buffer: int | None) -> None:
    """The kernel's send buffer of one connection held to send_buffer bytes (Linux grows a loopback one's)."""
    sock = transport.get_extra_info("socket")
    if send_buffer and sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        except OSError:                         # not a TCP socket (a Unix socket in a test): left as it is
            pass


def _evict_oldest_waiting(conn, max_connections: int, warned: list[float]) -> None:
    """Over the cap: abort the other connection that has waited longest for its (next) request."""
    live = [c for c in conn.connections if not getattr(c, "_evicted", False)]
    if len(live) <= max_connections:
        return
    others = [c for c in live if c is not conn and getattr(c, "waiting", None) and c.waiting()]
    if others:
        oldest = min(others, key=lambda c: c._waiting_since)
        now = time.monotonic()
        if now - warned[0] >= 1.0:              # a flood logs once a second, not once a connection
            warned[0] = now
            log.warning("%d connections open (--max-connections %d): closing the one that waited "
                        "%.1f s for its request", len(live), max_connections, now - oldest._waiting_since)
        oldest._evicted = True
        oldest.transport.abort()                # connection_lost soon: out of `connections`


def _reset(transport) -> None:
    """Abort with a reset: the kernel drops what it still holds for the client (close() would wait for
    the buffer to drain, for ever)."""
    sock = transport.get_extra_info("socket")
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except (AttributeError, OSError):
        pass
    transport.abort()


@functools.lru_cache(maxsize=None)
def _timed_h11(request_timeout: float, write_timeout: float = 30.0, max_connections: int | None = None,
               send_buffer: int | None = None):
    """uvicorn's h11 protocol with the guards uvicorn lacks (the module docstring says which and why)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    reading = (h11.IDLE, h11.SEND_BODY)
    _warned = [-1e9]                            # when an eviction was last logged
    limit = None if max_connections is None else max_connections + 1
    busy_app = None if max_connections is None else _over_cap(max_connections)

    class TimedH11Protocol(H11Protocol):
        _deadline = None
        _write_deadline = None
        _waiting_since = 0.0                    # when it started to wait for its (next) request
        _evicted = False                        # aborted by the cap, not yet lost

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._app = self.app
            self.limit_concurrency = None       # uvicorn's own check answers plain text: ours is handle_events'

        def handle_events(self) -> None:
            # uvicorn's limit_concurrency rule, evaluated in the same call that starts a request's task
            if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
                self.app = busy_app
            else:
                self.app = self._app
            super().handle_events()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(request_timeout, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if self.conn.their_state in reading and not self.transport.is_closing():
                self.transport.close()          # connection_lost: a running request sees http.disconnect

        def waiting(self) -> bool:
            """No request of its own is being served: it connected or kept alive and has not sent one whole
            (or it is closing, with what it has not read still buffered)."""
            return self.conn.their_state in reading and not self._evicted

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            _hold_send_buffer(transport, send_buffer)
            self._waiting_since = time.monotonic()
            self._arm()
            if max_connections is not None and len(self.connections) > max_connections:
                _evict_oldest_waiting(self, max_connections, _warned)

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and self.conn.their_state is h11.IDLE:
                self._arm()                     # the first bytes of the next request on a kept-alive connection
            super().data_received(data)
            if self.conn.their_state not in reading:
                self._disarm()                  # the whole request is in

        def on_response_complete(self) -> None:
            self._disarm()                      # idle from here: timeout_keep_alive applies
            self._waiting_since = time.monotonic()
            super().on_response_complete()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._write_deadline is None:
                self._write_deadline = self.loop.call_later(write_timeout, self._stalled)

        def resume_writing(self) -> None:
            self._cancel_write_deadline()
            super().resume_writing()

        def _cancel_write_deadline(self) -> None:
            if self._write_deadline is not None:
                self._write_deadline.cancel()
                self._write_deadline = None

        def _stalled(self) -> None:
            self._write_deadline = None
            log.warning("%s took nothing of its response for %g s: dropped", self.client, write_timeout)
            _reset(self.transport)

        def connection_lost(self, exc) -> None:
            self._disarm()
            self._cancel_write_deadline()
            super().connection_lost(exc)

    return TimedH11Protocol
