"""What a command shows on a terminal: a pseudo-terminal's output, read until the command closes its end."""

import os


def read_terminal(controller: int) -> bytes:
    """Everything written to the terminal whose controlling end is ``controller``, until its other end closes."""
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal's other end closed
            break
        if not chunk:
            break
        shown += chunk
    return shown
