"""Commands run at a terminal (a pty), for the tests of what is drawn only there
(tests/test_progress.py, tests/test_object_store.py, tests/test_ingest.py,
tests/audit/test_audit_cli.py)."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import struct
import subprocess
import termios


def on_a_terminal(
    command: list[str], *, stdout_too: bool = False, stop_after: bytes | None = None
) -> str:
    """What ``command`` wrote to a terminal (200 columns) on stderr, and on
    stdout too with ``stdout_too`` (as a user at a terminal sees both). A
    command that runs until stopped (a server) gets SIGTERM once ``stop_after``
    was written. The command must exit with 0 (the assertion shows what it wrote)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
    # The terminal's own size, not one left in the environment (readline, once
    # loaded in this process, exports COLUMNS and LINES, which rich prefers).
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=follower if stdout_too else subprocess.DEVNULL,
            stderr=follower,
            env=env,
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the follower side closed
                break
            if not chunk:
                break
            chunks.append(chunk)
            if stop_after is not None and stop_after in b"".join(chunks):
                process.send_signal(signal.SIGTERM)
                stop_after = None
        code = process.wait(timeout=120)
    finally:
        os.close(leader)
    output = b"".join(chunks).decode(errors="replace")
    assert code == 0, f"{command} exited with {code}:\n{output}"
    return output
