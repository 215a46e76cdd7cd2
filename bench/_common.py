"""What the benchmark scripts share (run them as ``python bench/NAME.py``)."""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable
from typing import Any


def measure(fn: Callable[[], Any], *, memory: bool = True) -> tuple[Any, float, int | None]:
    """(result, seconds of a plain run, tracemalloc peak bytes of a second, traced run or None).

    The timed run is not traced, so tracing does not slow what is timed.
    """
    gc.collect()
    t0 = time.perf_counter()
    result = fn()
    dt = time.perf_counter() - t0
    peak = None
    if memory:
        gc.collect()
        tracemalloc.start()
        try:
            fn()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    return result, dt, peak


def print_vs_table(title: str, rows: list[tuple[str, str, str, str]], ratio: str, legend: str) -> None:
    """A table of OpenSM's figure beside ibfm's: (what, OpenSM, ibfm, ratio) rows under ``title``."""
    width = max(len(title), *(len(r[0]) for r in rows))
    print()
    print(f"{title:<{width}}  {'OpenSM':>10}  {'ibfm':>10}  {ratio}")
    for a, b, c, d in rows:
        print(f"{a:<{width}}  {b:>10}  {c:>10}  {d}")
    print(legend)
