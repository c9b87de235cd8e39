"""A closed upstream connection is freed by reference counting, not left for the cyclic
garbage collector (which the gateway runs rarely: ``Gateway.startup`` tunes it so).  No
socket: the protocol's own callbacks, as the event loop would call them."""

from __future__ import annotations

import gc
import weakref

from velvetrope.gateway.upstream.httpclient import _Conn


def test_a_lost_connection_leaves_no_reference_cycle() -> None:
    conn = _Conn(("127.0.0.1", 9, False))
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel")
    assert conn.head_done and conn.status == 200
    conn.connection_lost(ConnectionResetError("reset by peer"))
    assert conn.closed and isinstance(conn.error, ConnectionResetError)
    ref = weakref.ref(conn)
    gc.disable()
    try:
        del conn
        assert ref() is None, "the connection survives its last reference: a cycle holds it"
    finally:
        gc.enable()
