"""Argument types the subcommands share: each turns text into a value or an argparse error naming it."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from sm.routing.base import DEFAULT_CHAIN, parse_chain

__all__ = ["DEFAULT_CHAIN", "engine_chain", "int_at_least", "number_in"]


def engine_chain(text: str) -> tuple[str, ...]:
    """``ftree,updn,minhop`` -> the engine names, each known."""
    try:
        return tuple(parse_chain(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def int_at_least(lo: int) -> Callable[[str], int]:
    """An integer type that is at least ``lo``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}: {text!r}")
        return v

    parse.__name__ = f"int>={lo}"
    return parse


def number_in(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], float]:
    """A float type within [lo, hi] ((lo, hi] with ``lo_open``); finite."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        low_ok = v > lo if lo_open else v >= lo
        if not (math.isfinite(v) and low_ok and v <= hi):
            raise argparse.ArgumentTypeError(f"must be within {'(' if lo_open else '['}{lo:g}, {hi:g}]: {text!r}")
        return v

    parse.__name__ = "number"
    return parse
