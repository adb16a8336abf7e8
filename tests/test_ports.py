"""gnnio.utils.ports.reserved_port: no socket bound to port 0 gets the port before the processes
it is meant for bind it (with SO_REUSEADDR, as c10d's store does)."""

from __future__ import annotations

import socket

from gnnio.utils.ports import reserved_port


def _handed_out(port: int, tries: int) -> bool:
    for _ in range(tries):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            if s.getsockname()[1] == port:
                return True
    return False


def test_a_reserved_port_goes_to_no_socket_bound_to_port_0_but_to_the_store():
    port = reserved_port()
    # the local port range holds ~28k ports: a port merely found free comes back within a few
    # thousand binds here (950-8,684 measured), a reserved one not in 60,000
    assert not _handed_out(port, 60_000)
    with socket.socket() as s:  # what c10d's TCPStore does with MASTER_PORT
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(1)
