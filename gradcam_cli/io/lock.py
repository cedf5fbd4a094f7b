"""Claiming a folder for one run: creating it, checking that it can be written, and locking it, so that two runs
never write into the same output folder (or the same manifest) at once.

The lock is a non-blocking ``flock`` on a small hidden file (``<output_dir>/.gradcam.lock``,
:data:`~gradcam_cli.io.naming.LOCK_NAME`) that holds the running process's id; it is removed when the run ends, and
the operating system releases it by itself if the process dies (forked decoding processes close their copies, so
one that outlives a killed run does not keep it). On Windows ``msvcrt.locking`` takes its place; where the file
system cannot lock (some network shares), the run proceeds unlocked.

The shards of one job (``--shard K/N``) share their output folder: each holds the folder's lock *shared* (so that
an ordinary run, which holds it exclusively, cannot write there at the same time, and ``gradcam merge`` waits for
them) and its own shard lock exclusively (so that the same shard cannot run twice at once).

>>> with FolderLock(Path("gradcam_out") / LOCK_NAME, "gradcam_out", "--output-dir"):
...     ...  # a second run into gradcam_out now fails with one line
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from types import TracebackType

from ..errors import UsageError, describe

if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import msvcrt

    def _try_lock(fd: int, shared: bool = False) -> bool:
        if shared:  # msvcrt has no shared locks: the shards' own locks still keep each shard single
            return True
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        with contextlib.suppress(OSError):  # a shared "lock" that was never taken
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _try_lock(fd: int, shared: bool = False) -> bool:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError:  # a file system without locks (some network shares): run unlocked
            return True
        return True

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


_HELD: set[int] = set()
"""Descriptors of the locks this process holds."""


def _close_inherited() -> None:
    """In a forked child (a decoding process): close the copies of the lock descriptors, so that a child outliving
    a killed run does not keep its folder locked (closing a copy leaves the parent's lock in place)."""
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited)


def ensure_folder(folder: Path, option: str, named: Path | None = None) -> None:
    """Create ``folder`` (and its parents) unless it exists. ``option`` names the path ``named`` (the folder
    itself, or a file to go in it) in the one-line :class:`UsageError` when a file is in the way or the folder
    cannot be created."""
    if folder.is_dir():
        return
    named = named or folder
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker == named:
        raise UsageError(f"{option} {named} is a file, not a folder")
    if blocker is not None:
        raise UsageError(f"{option} {named}: {blocker.name or blocker} in that path is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        which = "this folder" if named == folder else "its folder"
        raise UsageError(f"{option} {named}: cannot create {which}: {describe(error, named)}") from None


class FolderLock:
    """An exclusive lock held through the file ``path`` while the ``with`` block runs (``shared``: a lock many
    holders share, which keeps out exclusive ones).

    ``shown`` (the folder or file the lock protects) and ``option`` (the command-line option that names it) go
    into the one-line errors: another run holding the lock, or ``path`` that cannot be created (an unwritable
    folder). :meth:`held_by` reads the holder's process id (an exclusive holder's; shared holders write none).
    """

    def __init__(self, path: Path, shown: Path | str, option: str, shared: bool = False) -> None:
        self.path, self.shown, self.option, self.shared = path, shown, option, shared
        self.fd: int | None = None

    def __enter__(self) -> FolderLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock or raise :class:`UsageError` at once (never waits)."""
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
            except OSError as error:
                reason = describe(error, self.path)
                raise UsageError(f"{self.option} {self.shown}: cannot write there: {reason}") from None
            if not _try_lock(fd, self.shared):
                os.close(fd)
                holder = self.held_by()
                by = f" (pid {holder})" if holder is not None else ""
                raise UsageError(
                    f"another gradcam run{by} is writing to {self.shown}; wait for it or choose another {self.option}"
                )
            if self._still_named(fd):
                break
            os.close(fd)  # the holder removed the file as we opened it: lock the one now named path
        if not self.shared:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        _HELD.add(fd)

    def _still_named(self, fd: int) -> bool:
        """Whether ``fd`` is still the file called ``path`` (a releasing run unlinks it before unlocking)."""
        try:
            named, opened = os.stat(self.path), os.fstat(fd)
        except OSError:
            return False
        return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)

    def held_by(self) -> int | None:
        """The process id written by the run holding the lock, if it can be read."""
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return int(text) if text.isdigit() else None

    def release(self) -> None:
        """Remove the lock file and unlock (a no-op when not held); a shared lock leaves the file to its other
        holders."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        _HELD.discard(fd)
        if not self.shared:
            with contextlib.suppress(OSError):
                self.path.unlink()  # while still locked, so that no other run locks the file being removed
        with contextlib.suppress(OSError):
            _unlock(fd)
        os.close(fd)
