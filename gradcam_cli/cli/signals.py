"""SIGTERM and SIGHUP (``kill``, a closed terminal, a service manager stopping the command) end a command as Ctrl-C
does: :class:`KeyboardInterrupt`, so that the same clean-up runs (a batch in hand finished and recorded, locks
released, temporary files and uploads removed) and the command exits with 130."""

from __future__ import annotations

import signal
import threading

TERMINATING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
"""The signals taken for Ctrl-C (SIGHUP is not on Windows)."""


def interrupt_on_termination() -> None:
    """Make :data:`TERMINATING` raise :class:`KeyboardInterrupt` in the main thread, where they have their default
    meaning (one ignored, say by ``nohup``, stays ignored)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for number in TERMINATING:
        if signal.getsignal(number) is signal.SIG_DFL:
            signal.signal(number, signal.default_int_handler)
