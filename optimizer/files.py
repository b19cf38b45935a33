"""Files kvtier writes: checked before the work that fills them, written atomically.

The ground floor every layer may use (``trace``, ``search``, ``report``, ``cli``).


A command that computes for minutes (``optimize``, ``validate``, ``report --what-if``) and
then finds it cannot write its file has wasted that time and, written naively, ends in a
traceback. :func:`check_output` asks the file system first, the same way the atomic write
(:func:`atomic_write`) will: the directory is created and a temporary file made
and removed in it. :func:`guard_outputs` refuses, before any work, an output that would
overwrite one of the command's own inputs, its study database or another of its outputs.
:func:`check_allocation` does the same for memory: an array whose size a file or option
derives is weighed against the machine's memory before it is made.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import unquote

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


PathArg = str | os.PathLike[str] | None


def sqlite_path(url: str | None) -> str | None:
    """The database file of an SQLite URL (``sqlite:///FILE``, ``sqlite:////ABS``, the URI form
    ``sqlite:///file:PATH?...``), else None (another database, in memory, or no URL)."""
    prefix = "sqlite:///"
    if not url or not url.startswith(prefix):
        return None
    rest = url[len(prefix) :]
    if rest.startswith("file:"):
        rest = unquote(rest[len("file:") :])
    rest = rest.split("?", 1)[0]
    return None if rest in ("", ":memory:") else rest


def _where(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.path.abspath(os.fspath(path)))


def _same(a: str, b: str) -> bool:
    """The same file: one resolved path, or one inode (a hard link)."""
    if a == b:
        return True
    try:
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    except OSError:
        return False


def _inside(path: str, directory: str) -> bool:
    return os.path.isdir(directory) and os.path.commonpath([directory, path]) == directory


def guard_outputs(
    outputs: Mapping[str, PathArg],
    inputs: Mapping[str, PathArg] | None = None,
    databases: Mapping[str, str | None] | None = None,
) -> None:
    """Refuse, before any work, an output that would destroy what the command reads or writes.

    ``outputs``, ``inputs`` and ``databases`` map the option that names each file to its path
    (None: not given; an input that does not exist is skipped, as a profile's name);
    ``databases`` holds storage URLs, of which an SQLite file counts, made or not. An
    output may not be, by its resolved path (``..`` and symbolic links followed) or as a hard
    link, any input or database, nor lie inside an input directory (a dataset whose next read
    would take it for a part), nor be a directory holding an input (a dataset output replaces
    its directory whole), nor be another output or lie inside one. One-line
    :class:`InputError` naming the output's option and the file it would overwrite.
    """
    given_out = [(opt, os.fspath(p), _where(p)) for opt, p in outputs.items() if p is not None]
    # an input that is not a file is a name (a built-in profile) or fails on its own read
    given_in = [
        (opt, os.fspath(p), _where(p))
        for opt, p in (inputs or {}).items()
        if p and os.path.lexists(p)
    ]
    roles = {opt: "input" for opt, _, _ in given_in}
    for opt, url in (databases or {}).items():
        db = sqlite_path(url)
        if db is not None:
            roles[opt] = "study database"
            # SQLite's write-ahead log and shared-memory files belong to the database too
            given_in += [(opt, db + tail, _where(db + tail)) for tail in ("", "-wal", "-shm")]
    for k, (opt, shown, out) in enumerate(given_out):
        for in_opt, in_shown, src in given_in:
            if _same(out, src):
                what = f"is the {roles[in_opt]} {in_opt} {in_shown}"
            elif _inside(out, src):
                what = f"is inside the input dataset directory {in_opt} {in_shown}"
            elif _inside(src, out):  # a directory output (a dataset) is replaced whole
                what = f"is a directory holding the input {in_opt} {in_shown}"
            else:
                continue
            raise InputError(f"{shown} {what}; write to another path", option=opt)
        for other_opt, other_shown, other in given_out[k + 1 :]:
            if _same(out, other) or _inside(out, other) or _inside(other, out):
                raise InputError(
                    f"{shown} and {other_opt} {other_shown} are the same file; give each "
                    "output its own path",
                    option=opt,
                )


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


def available_memory() -> int:
    """Bytes of memory this machine can give a new allocation now (Linux: ``MemAvailable``;
    elsewhere the physical memory)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 1 << 62  # unknown: nothing is refused here


def _gib(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("TiB", 2**40), ("PiB", 2**50), ("EiB", 2**60)):
        if n < 1024 * scale or unit == "EiB":
            return f"{n / scale:.3g} {unit}" if n < 2**70 else f"{n:.3g} bytes"
    return f"{n:.3g} bytes"


def check_allocation(
    nbytes: float,
    what: str,
    *,
    option: str | None = None,
    path: str | None = None,
) -> None:
    """Refuse, before it is made, an allocation of ``nbytes`` (derived from ``option`` or a
    file's key) that this machine cannot hold: one line naming what and why, instead of a
    ``MemoryError`` (or an ``OverflowError``) deep in numpy after the work began."""
    avail = available_memory()
    if not (math.isfinite(nbytes) and nbytes <= avail):
        raise InputError(
            f"{what} would need {_gib(nbytes) if math.isfinite(nbytes) else 'unbounded'} of "
            f"memory; this machine has {_gib(avail)} available",
            option=option,
            path=path,
        )
