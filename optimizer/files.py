"""Files kvtier writes: checked before the work that fills them, written atomically.

The ground floor every layer may use (``trace``, ``search``, ``report``, ``cli``).


A command that computes for minutes (``optimize``, ``validate``, ``report --what-if``) and
then finds it cannot write its file has wasted that time and, written naively, ends in a
traceback. :func:`check_output` asks the file system first, the same way the atomic write
(:func:`atomic_write`) will: the directory is created and a temporary file made
and removed in it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from kvtier.errors import InputError


def check_output(path: str | os.PathLike[str], *, option: str) -> None:
    """Refuse now a file that could not be written later: a directory, a path under a file,
    a read-only or full file system; one-line :class:`InputError` naming ``option``."""
    target = Path(path)
    if target.is_dir():
        raise InputError(f"{target} is a directory; give a file path", option=option)
    for parent in target.parents:
        if parent.exists() and not parent.is_dir():
            raise InputError(f"cannot write {target}: {parent} is not a directory", option=option)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as err:
        raise InputError(f"cannot write {target}: {err.strerror or err}", option=option) from None


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` and rename the result onto ``path`` in one step.

    The temporary file is flushed to disk (fsync) before the rename and the directory after it,
    so a crash leaves either the old file or the whole new one. A directory that cannot be
    created or written, or a full disk, is an :class:`InputError` naming the path (nothing is
    left behind).
    """
    target = Path(path)
    for parent in target.parents:  # mkdir would say only "File exists"
        if parent.exists() and not parent.is_dir():
            raise InputError(f"cannot write: {parent} is a file, not a directory", path=str(target))
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
        _fsync(tmp)
        os.replace(tmp, target)
        _fsync(str(target.parent), directory=True)
    except OSError as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        reason = err.strerror or str(err)
        raise InputError(f"cannot write: {reason}", path=str(target)) from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def _fsync(path: str, *, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if directory:
            return  # some file systems cannot open a directory; the rename is still atomic
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)
