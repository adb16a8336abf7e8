"""A TCP port for processes started afterwards to bind (``MASTER_PORT`` of torch.distributed's
``env://`` rendezvous), reserved in the meantime.

A port merely found free (bind port 0, read it, close) can be handed by the kernel, before the
processes bind it, to any other socket bound to port 0 -- a concurrent run's ranks, another
test -- and the run then fails or hangs. :func:`reserved_port` closes the accepted end of a
connection to the port first, which leaves the port in TIME_WAIT for a minute: the kernel gives
it to no socket bound to port 0 or connecting out, while c10d's store (``SO_REUSEADDR``) can
still bind it. Where a launcher can take port 0 itself (``gnnio train --nproc``'s rendezvous,
``torchrun --standalone``), that is better still.
"""

from __future__ import annotations

import socket

__all__ = ["reserved_port"]


def reserved_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that only a ``SO_REUSEADDR`` bind will get for the next minute."""
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((host, 0))
        srv.listen(1)
        port = int(srv.getsockname()[1])
        with socket.socket() as cli:
            cli.connect((host, port))
            conn, _ = srv.accept()
            conn.close()
    return port
