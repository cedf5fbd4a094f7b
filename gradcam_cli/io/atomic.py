"""Atomic file writes: a killed run never leaves a truncated output behind."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sys
import tempfile
from pathlib import Path

TEMP_MARKER = ".gradcam-tmp-"


def write_atomic(path: Path, data: bytes | bytearray) -> None:
    """Write ``data`` so that ``path`` only ever names the complete file, whenever the process is killed.

    On Linux a new file is written unnamed (``O_TMPFILE``) in its directory and then linked in under ``path``:
    a kill at any moment leaves no partial or temporary file at all. Elsewhere, or to replace an existing file,
    the bytes (encoded beforehand) go out in one write to a temporary name beside ``path`` (containing
    ``TEMP_MARKER``) that is then renamed over ``path``; only a kill inside that short write-and-rename leaves
    the temporary file, and :func:`remove_stale_temporaries` clears such leftovers on the next run.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if _write_unnamed(path, data):
        return
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARKER}", dir=path.parent)
    except OSError as error:
        raise _about(error, path) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp_name, 0o666 & ~_umask())
        os.replace(tmp_name, path)
    except BaseException as error:
        Path(tmp_name).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise _about(error, path) from None
        raise


def _about(error: OSError, path: Path) -> OSError:
    """``error`` about ``path`` itself: the temporary file's name is no business of the one who reads it."""
    return OSError(error.errno, error.strerror or str(error), str(path))


_PATH_REFUSED = frozenset({errno.ENAMETOOLONG, errno.ENOSPC, errno.EDQUOT, errno.EROFS})
"""Errors of linking an unnamed file that are about ``path`` or the disk, not about the way of linking."""


_unnamed_files = [sys.platform.startswith("linux") and hasattr(os, "O_TMPFILE")]


def _write_unnamed(path: Path, data: bytes | bytearray) -> bool:
    """Write ``data`` to an unnamed file in ``path``'s directory and link it in as ``path``, if ``path`` does not
    exist yet and the system supports it; False (nothing written) otherwise."""
    if not _unnamed_files[0] or os.path.lexists(path):
        return False
    try:
        fd = os.open(path.parent, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o666)
    except OSError:  # a file system without O_TMPFILE
        return False
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        return _link_unnamed(fd, path)
    finally:
        os.close(fd)


def _link_unnamed(fd: int, path: Path) -> bool:
    """Link an ``O_TMPFILE`` file in as ``path``: through /proc, or by ``linkat(AT_EMPTY_PATH)`` where that fails."""
    for method in list(_LINKERS):
        try:
            method(fd, path)
            return True
        except FileExistsError:
            return False
        except OSError as error:
            if error.errno in _PATH_REFUSED:  # the name is too long, the disk full: any other way fails as well
                raise _about(error, path) from None
            with contextlib.suppress(ValueError):  # another writer thread may have dropped it already
                _LINKERS.remove(method)  # not possible here: do not try it again
    _unnamed_files[0] = False  # neither works here: use temporary names from now on
    return False


def _link_via_proc(fd: int, path: Path) -> None:
    os.link(f"/proc/self/fd/{fd}", path, follow_symlinks=True)


def _link_empty_path(fd: int, path: Path) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.linkat(fd, b"", -100, os.fsencode(path), 0x1000) != 0:  # AT_FDCWD, AT_EMPTY_PATH
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(path))


_LINKERS = [_link_via_proc, _link_empty_path]


def remove_stale_temporaries(folder: Path) -> int:
    """Delete temporary files a killed run left under ``folder``; return how many."""
    removed = 0
    if folder.is_dir():
        for stale in folder.rglob(f".*{TEMP_MARKER}*"):
            stale.unlink(missing_ok=True)
            removed += 1
    return removed


@functools.lru_cache(maxsize=1)
def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
