"""Raw-socket probes for the connection checks (tests and the hostile-client benchmark)."""

import socket

# A request cut off inside its headers, and one whose body stops after 13 of its 40 declared bytes.
HALF_HEADERS = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Ty"
HALF_BODY = (
    b'POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{"queries": ['
)


def open_connection(port: int, first_bytes: bytes = b"") -> socket.socket:
    """A connection to 127.0.0.1:`port` that has sent `first_bytes` and waits."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if first_bytes:
        sock.sendall(first_bytes)
    return sock


def still_open(sock: socket.socket) -> bool:
    """True while the server has neither answered nor closed the connection."""
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:  # reset or otherwise gone
        pass
    finally:
        sock.settimeout(timeout)
    return False
