"""Atomic file writes: a reader sees the old file or the new one, never a half."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask() -> int:
    # Read once: os.umask can only be read by setting it, which races with other threads.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` through a temp file in the same directory, fsync, rename over ``path``, fsync the directory.

    The file gets the mode a plain ``open()`` would give it (0666 less the umask).
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the rename itself survives a crash
    finally:
        os.close(dfd)
