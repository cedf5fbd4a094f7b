"""One intra-op thread for a block, the count restored after: seeded training in tests gives the same model at any
thread count, and small passes run faster on busy cores without OpenMP's spin-waiting threads."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
