"""Keeping a run's rows in input order, and Ctrl-C that lets the batch in hand finish: shared by the local batch
(:mod:`gradcam_cli.pipeline.batch`) and the Ray engine (:mod:`gradcam_cli.pipeline.ray_engine`)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..cam.records import Record


class InOrder:
    """The reorder buffer: finished images' rows, by place in the input list, handed on in that order."""

    def __init__(self) -> None:
        self.waiting: dict[int, list[Record]] = {}
        self.next = 0

    def add(self, place: int, rows: list[Record]) -> None:
        self.waiting[place] = rows

    def ready(self) -> Iterator[Record]:
        """The rows of the images from the next place on, up to the first image not finished yet."""
        while self.next in self.waiting:
            rows = self.waiting.pop(self.next)
            self.next += 1
            yield from rows

    def rest(self) -> Iterator[Record]:
        """Every row still waiting, in order, whatever is missing before it (the run is over)."""
        for place in sorted(self.waiting):
            yield from self.waiting.pop(place)


INTERRUPTING = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
"""Ctrl-C, and the signals the command line takes for it (:mod:`gradcam_cli.cli.signals`)."""


@contextmanager
def deferred_interrupt() -> Iterator[Callable[[], bool]]:
    """While a batch runs, the first Ctrl-C only asks to stop: the batch in hand is finished, written and recorded,
    then :class:`KeyboardInterrupt` is raised. A second Ctrl-C interrupts at once. Only in the main thread, and only
    where Ctrl-C has Python's default meaning (a notebook's own handler is left alone). SIGTERM and SIGHUP, where the
    command line made them Ctrl-C, are deferred alike."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield lambda: False
        return
    deferred = [number for number in INTERRUPTING if signal.getsignal(number) is signal.default_int_handler]
    asked: list[bool] = []

    def on_interrupt(_signum: int, _frame: object) -> None:
        asked.append(True)
        for number in deferred:
            signal.signal(number, signal.default_int_handler)

    for number in deferred:
        signal.signal(number, on_interrupt)
    try:
        yield lambda: bool(asked)
    finally:
        for number in deferred:
            signal.signal(number, signal.default_int_handler)
