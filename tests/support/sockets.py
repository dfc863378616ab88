"""Raw-socket probes for the connection checks (tests and the hostile-client benchmark)."""

import socket


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
