"""The routing-engine interface, the LFT type and the engine chain.

An engine is constructed with its options and then is a pure function of
a fabric and its LID map: ``compute(fabric, lids) -> Lft``. An engine that
cannot route a topology raises :class:`RoutingError` and the chain tries
the next one, like OpenSM's ``-R ftree,updn,minhop``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from fabric.errors import IbfmError
from fabric.model import Fabric
from sm.lidmap import LidMap

DEFAULT_CHAIN: tuple[str, ...] = ("ftree", "updn", "minhop")
"""The engine chain when none is given, like OpenSM's ``-R ftree,updn,minhop``."""

NO_ROUTE = 255
"""LFT entry for a LID with no route."""

Lft = npt.NDArray[np.uint8]
"""``uint8[n_switches, max_lid + 1]``: output port per (switch row, LID).

Row ``i`` belongs to node ``fabric.switches[i]``; ``NO_ROUTE`` (255) means
no route; a switch's own LIDs map to port 0.
"""


class RoutingError(IbfmError):
    """An engine refuses a topology (e.g. "not a fat-tree")."""


@dataclass(frozen=True)
class RoutingOptions:
    """Options every engine may read; each ignores what it does not use."""

    root_guids: tuple[int, ...] = ()
    """Node GUIDs of root switches (updn, ftree); detected when empty."""


class RoutingEngine(Protocol):
    name: str

    def compute(self, fabric: Fabric, lids: LidMap) -> Lft: ...


EngineFactory = Callable[[RoutingOptions], RoutingEngine]

_ENGINE_MODULES = {"ftree": "sm.routing.ftree", "updn": "sm.routing.updn", "minhop": "sm.routing.minhop"}
_REGISTRY: dict[str, EngineFactory] = {}


def register(name: str) -> Callable[[EngineFactory], EngineFactory]:
    """Class decorator: make an engine available by ``name``."""

    def deco(factory: EngineFactory) -> EngineFactory:
        _REGISTRY[name] = factory
        return factory

    return deco


def engine_names() -> list[str]:
    return list(_ENGINE_MODULES)


def make_engine(name: str, options: RoutingOptions | None = None) -> RoutingEngine:
    """The engine registered as ``name``; ValueError for an unknown name."""
    if name not in _REGISTRY:
        mod = _ENGINE_MODULES.get(name)
        if mod is None:
            raise ValueError(f"unknown routing engine {name!r} (known: {', '.join(_ENGINE_MODULES)})")
        importlib.import_module(mod)
    return _REGISTRY[name](options or RoutingOptions())


def parse_chain(text: str) -> list[str]:
    """``"ftree,updn,minhop"`` -> names, checked."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError("empty routing engine list")
    for n in names:
        if n not in _ENGINE_MODULES:
            raise ValueError(f"unknown routing engine {n!r} (known: {', '.join(_ENGINE_MODULES)})")
    return names


def empty_lft(fabric: Fabric, lids: LidMap) -> Lft:
    """All-``NO_ROUTE`` LFT with each switch's own LIDs on port 0."""
    sw = fabric.switches
    lft = np.full((sw.size, lids.max_lid + 1), NO_ROUTE, np.uint8)
    for k in range(1 << lids.lmc):
        own = lids.base[sw, 0].astype(np.int64) + k
        ok = lids.base[sw, 0] > 0
        lft[np.flatnonzero(ok), own[ok]] = 0
    return lft


@dataclass
class RoutingResult:
    engine: str
    lft: Lft
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(engine, reason) for every engine that refused before ``engine`` ran."""


def route(
    fabric: Fabric, lids: LidMap, chain: Sequence[str], options: RoutingOptions | None = None
) -> RoutingResult:
    """Run the first engine of ``chain`` that accepts the topology."""
    refused: list[tuple[str, str]] = []
    for name in chain:
        engine = make_engine(name, options)
        try:
            lft = engine.compute(fabric, lids)
        except RoutingError as e:
            refused.append((name, str(e)))
            continue
        return RoutingResult(name, lft, refused)
    detail = "; ".join(f"{n}: {r}" for n, r in refused)
    raise RoutingError(f"no engine in {','.join(chain)} could route the fabric ({detail})")
