"""uvicorn's configuration for `ramforge serve`: a deadline for reading each request."""
from __future__ import annotations

import functools


def uvicorn_config(app, host: str = "127.0.0.1", port: int = 11434, *, timeout_keep_alive: float = 5.0,
                   request_timeout: float = 10.0, **kwargs):
    """uvicorn's Config for `app`, with a deadline for reading each request (see `_timed_h11`) and
    `timeout_keep_alive` seconds for an idle keep-alive connection."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, http=_timed_h11(float(request_timeout)),
                          timeout_keep_alive=timeout_keep_alive, **kwargs)


@functools.lru_cache(maxsize=None)
def _timed_h11(request_timeout: float):
    """uvicorn's h11 protocol, disconnecting a client that does not send a whole request (headers
    and body) within `request_timeout` seconds of connecting or of its first byte after a response.
    uvicorn's own timeout_keep_alive only covers the idle time between requests: a client that
    connects and sends nothing, or part of the headers, or part of a body, is otherwise held open
    for good (and a partial body keeps its request task waiting in `receive()`)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    reading = (h11.IDLE, h11.SEND_BODY)

    class TimedH11Protocol(H11Protocol):
        _deadline = None

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

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._deadline is None and self.conn.their_state is h11.IDLE:
                self._arm()                     # the first bytes of the next request on a kept-alive connection
            super().data_received(data)
            if self.conn.their_state not in reading:
                self._disarm()                  # the whole request is in

        def on_response_complete(self) -> None:
            self._disarm()                      # idle from here: timeout_keep_alive applies
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return TimedH11Protocol
