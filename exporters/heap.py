"""Giving the C heap's free pages back to the system (glibc ``malloc_trim``), for the daemon and the exporter."""

from __future__ import annotations

import ctypes
from collections.abc import Callable


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)
        fn = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_MALLOC_TRIM = _load_malloc_trim()


def trim_heap() -> bool:
    """Give the free memory of the C heap back to the system (glibc ``malloc_trim(0)``); False elsewhere.

    Called after every heavy sweep, whose temporaries (discovery, routing, programming,
    verification) leave a high-water mark of freed but resident pages in malloc's
    arenas, and after a metrics render that rebuilt families (the render's temporaries, in
    each thread's arena). The number of arenas is ``MALLOC_ARENA_MAX``, read by glibc when the
    process starts, so it can only be set in the environment that starts ``ibfm serve`` (for
    instance ``Environment=MALLOC_ARENA_MAX=2`` in a systemd unit): fewer arenas hold
    less freed memory across the worker threads, for a little lock contention.
    """
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True
