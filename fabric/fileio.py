"""Atomic file writes: a reader sees the old file or the new one, never a half.

A write goes through a temp file ``.<name>.XXXXXXXX.tmp`` beside the target. The writer holds
an exclusive ``flock`` on it until the rename, so :func:`remove_stale_temps` can tell the temp
file of a killed writer (lock free) from one being written now (lock held).
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import tempfile
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def _umask() -> int:
    # Read once: os.umask can only be read by setting it, which races with other threads.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()


def _temp_prefix(p: Path) -> str:
    return f".{p.name}."


def temp_name_pattern(path: str | os.PathLike[str]) -> re.Pattern[str]:
    """The names of the temp files a write of ``path`` creates (``tempfile.mkstemp``: 8 of ``[a-z0-9_]``)."""
    p = Path(path)
    return re.compile(re.escape(_temp_prefix(p)) + r"[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX))


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _locked_temp(p: Path) -> tuple[int, str]:
    """A new temp file beside ``p``, locked, and still under its name (remove_stale_temps may have taken it
    between its creation and our lock: then take another)."""
    while True:
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(p), suffix=TEMP_SUFFIX, dir=p.parent)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(os.stat(tmp, follow_symlinks=False), os.fstat(fd)):
                return fd, tmp
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            Path(tmp).unlink(missing_ok=True)
            raise
        os.close(fd)


def _write_atomic(path: str | os.PathLike[str], data: str | bytes, mode: int | None = None) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _locked_temp(p)
    try:
        with os.fdopen(fd, "w" if isinstance(data, str) else "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK if mode is None else mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, p)  # before the lock goes with the descriptor: a locked temp name only ever vanishes
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the rename itself survives a crash
    finally:
        os.close(dfd)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` through a temp file in the same directory, fsync, rename over ``path``, fsync the directory.

    The file gets the mode a plain ``open()`` would give it (0666 less the umask).
    """
    _write_atomic(path, text)


def copy_atomic(src: str | os.PathLike[str], dest: str | os.PathLike[str]) -> bool:
    """Replace ``dest`` atomically by a copy of ``src`` (same bytes, same permission bits); ``src`` stays.

    False, and nothing done, when ``src`` does not exist.
    """
    try:
        with open(src, "rb") as f:
            data = f.read()
            mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode) & 0o777
    except FileNotFoundError:
        return False
    _write_atomic(dest, data, mode)
    return True


def remove_stale_temps(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temp files that writes of ``path`` left behind when killed; returns those removed.

    Only names of exactly :func:`temp_name_pattern`'s form are candidates, and only when no live
    writer holds their lock. A directory that cannot be listed removes nothing: the caller's
    own read or write of ``path`` reports that better.
    """
    p = Path(path)
    pattern = temp_name_pattern(p)
    removed: list[Path] = []
    try:
        names = [e.name for e in os.scandir(p.parent) if pattern.fullmatch(e.name)]
    except OSError:
        return removed
    for name in names:
        tmp = p.parent / name
        try:
            # read-write: flock over NFS is a POSIX lock, and an exclusive one needs a writable descriptor
            fd = os.open(tmp, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # gone already, a symlink, or not ours to open
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a writer is at work on it
            try:
                same = os.stat(tmp, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if _same_file(same, st):
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def db_lines(
    path: str | os.PathLike[str], what: str, error: type[Exception]
) -> tuple[list[tuple[int, str]], list[str]]:
    """The lines of one of OpenSM's database files (guid2lid, guid2mkey, neighbors): (line number, the text
    before any ``#``) for each, and a warning naming file, line and column for each line with a byte that is
    not ASCII (that line is skipped). Read on bytes, so a stray byte costs its own line only: the comment is
    cut off first, and UTF-8 builds every character but ``#`` from bytes >= 0x80. A missing file has no
    lines; one that cannot be read raises ``error``."""
    p = Path(path)
    lines: list[tuple[int, str]] = []
    warnings: list[str] = []
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        return lines, warnings
    except OSError as e:
        raise error(f"{p}: cannot read the {what} file: {e.strerror or e}") from e
    for n, line in enumerate(raw.removeprefix(b"\xef\xbb\xbf").split(b"\n"), 1):
        data = line.split(b"#", 1)[0]
        try:
            lines.append((n, data.decode("ascii")))
        except UnicodeDecodeError as e:
            warnings.append(f"{p}:{n}:{e.start + 1}: byte {data[e.start]:#04x} is not ASCII; entry ignored")
    return lines, warnings


def backup_path(path: str | os.PathLike[str]) -> Path:
    """Where a rewrite that drops or changes entries keeps the previous file: ``NAME.bak`` beside it."""
    p = Path(path)
    return p.with_name(p.name + ".bak")


def keep_before_loss(path: str | os.PathLike[str], what: str, error: type[Exception]) -> str | None:
    """Copy ``path`` to :func:`backup_path` before a rewrite that drops or changes entries; the note to tell the
    operator when a copy was made (None when there was no file). ``error`` when the copy fails: the file is
    then left as it is."""
    p = Path(path)
    bak = backup_path(p)
    try:
        kept = copy_atomic(p, bak)
    except OSError as e:
        raise error(
            f"{bak}: cannot keep the previous {what} file before a rewrite that drops or changes its entries: "
            f"{e.strerror or e}; {p} left as it is"
        ) from e
    return f"{p}: entries dropped or changed; the previous file is kept as {bak}" if kept else None


class TextFileError(Exception):
    """A configuration file that cannot be read as UTF-8 text: where (``line``, ``col``; 0, 0 for the
    whole file), why, and whether the file is simply missing."""

    def __init__(self, line: int, col: int, reason: str, *, missing: bool = False) -> None:
        super().__init__(reason)
        self.line, self.col, self.reason, self.missing = line, col, reason, missing


def read_utf8(path: str | os.PathLike[str]) -> str:
    """The text of a configuration file; :class:`TextFileError` locates a byte that is not UTF-8."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise TextFileError(0, 0, "no such file", missing=True) from None
    except OSError as e:
        raise TextFileError(0, 0, f"cannot read: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[: e.start]
        line = before.count(b"\n") + 1
        col = len(before) - (before.rfind(b"\n") + 1) + 1
        raise TextFileError(line, col, f"not UTF-8 text (byte 0x{data[e.start]:02x})") from None
