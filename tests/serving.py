"""A uvicorn server run in a thread for the server tests."""
from __future__ import annotations

import contextlib
import socket
import threading
import time


@contextlib.contextmanager
def serving(server):
    """Run a uvicorn.Server in a thread on 127.0.0.1 at a free port; yields (url, thread). On exit it
    is stopped and the thread must end."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", thread
    finally:
        server.should_exit = True
        thread.join(30)
    assert not thread.is_alive()
