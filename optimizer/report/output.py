"""Output files checked before the work that fills them.

A command that computes for minutes (``optimize``, ``validate``, ``report --what-if``) and
then finds it cannot write its file has wasted that time and, written naively, ends in a
traceback. :func:`check_output` asks the file system first, the same way the atomic write
(``kvtier.trace.io.atomic_write``) will: the directory is created and a temporary file made
and removed in it.
"""

from __future__ import annotations

import os
import tempfile
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
