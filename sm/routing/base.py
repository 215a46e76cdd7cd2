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

DEFAULT_CHAIN: tuple[str, ...] = ("ftree", "layered", "updn", "minhop")
"""The engine chain when none is given: ftree on fat-trees, layered (deadlock-free over VL layers) on
anything else, updn (one VL) when the layers would need more VLs than the links have. minhop comes
last: its routes are lifted onto layers like any engine's, and it is refused when that is not enough."""

NO_ROUTE = 255
"""LFT entry for a LID with no route."""

Lft = npt.NDArray[np.uint8]
"""``uint8[n_switches, max_lid + 1]``: output port per (switch row, LID).

Row ``i`` belongs to node ``fabric.switches[i]``; ``NO_ROUTE`` (255) means
no route; a switch's own LIDs map to port 0.
"""


Layers = npt.NDArray[np.uint8]
"""``uint8[n_switches, max_lid + 1]``: the layer (service level) of each route.

Entry ``[i, lid]`` is the SL that packets to ``lid`` carry when they enter
the fabric at switch row ``i``: sent by that switch itself or by any CA
attached to it. Every port maps SL ``k`` to VL ``k`` for the layers an
engine uses, so each layer is one VL and its channel dependency graph must
be acyclic on its own. ``None`` in a result means one layer (SL 0).
"""


@dataclass(frozen=True)
class Routes:
    """What a layering engine returns: the LFTs and the layer of every route."""

    lft: Lft
    layers: Layers | None = None
    acyclic: bool = False
    """The routes were checked on one VL (from CAs, every LID) and have no credit loop."""


class RoutingError(IbfmError):
    """An engine refuses a topology (e.g. "not a fat-tree")."""


@dataclass(frozen=True)
class RoutingOptions:
    """Options every engine may read; each ignores what it does not use."""

    root_guids: tuple[int, ...] = ()
    """Node GUIDs of root switches (updn, ftree); detected when empty."""
    max_layers: int = 8
    """VL layers (SLs mapped one to one onto VLs) routes may spread over: the links' operational VLs
    (ibsim's VLCap is 8). An engine whose routes would need more is refused."""


class RoutingEngine(Protocol):
    name: str

    def compute(self, fabric: Fabric, lids: LidMap) -> Lft | Routes: ...


EngineFactory = Callable[[RoutingOptions], RoutingEngine]

_ENGINE_MODULES = {
    "ftree": "sm.routing.ftree",
    "layered": "sm.routing.layered",
    "updn": "sm.routing.updn",
    "minhop": "sm.routing.minhop",
}
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


def _lift(fabric: Fabric, lids: LidMap, lft: Lft, max_layers: int, engine: str) -> Routes:
    """The LFT on one layer when that has no credit loop, else lifted onto as few layers as the layering finds."""
    from sm.analysis.creditflow import channel_dependency_graph, cycle_core
    from sm.routing.layered import assign_layers

    if not cycle_core(channel_dependency_graph(fabric, lids, lft, from_cas=True)).any():
        return Routes(lft, acyclic=True)
    layers = assign_layers(fabric, lids, lft, max_layers, from_cas=True, engine=engine)
    return Routes(lft, layers if layers.any() else None)


@dataclass
class RoutingResult:
    engine: str
    lft: Lft
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(engine, reason) for every engine that refused before ``engine`` ran."""
    layers: Layers | None = None
    """The SL of every route (see :data:`Layers`); None when all routes use SL 0."""
    acyclic: bool = False
    """:func:`route` found no credit loop in these routes on one VL: the SM's own check would find none."""


def route(
    fabric: Fabric, lids: LidMap, chain: Sequence[str], options: RoutingOptions | None = None
) -> RoutingResult:
    """Run the first engine of ``chain`` that accepts the topology.

    Routes an engine returns on one layer are checked for credit loops (the
    SM's check: routes from CAs, every LID); where there is one, the routes
    through it are lifted onto further layers by
    :func:`sm.routing.layered.assign_layers`, and the result carries the
    layers. An engine whose routes would need more layers than
    ``options.max_layers`` counts as refusing, so the chain goes on.
    """
    options = options or RoutingOptions()
    refused: list[tuple[str, str]] = []
    for name in chain:
        engine = make_engine(name, options)
        try:
            out = engine.compute(fabric, lids)
            routes = out if isinstance(out, Routes) else Routes(out)
            if routes.layers is None and not getattr(engine, "layers_checked", False):
                routes = _lift(fabric, lids, routes.lft, options.max_layers, name)
        except RoutingError as e:
            refused.append((name, str(e)))
            continue
        return RoutingResult(name, routes.lft, refused, routes.layers, routes.acyclic)
    detail = "; ".join(f"{n}: {r}" for n, r in refused)
    raise RoutingError(f"no engine in {','.join(chain)} could route the fabric ({detail})")
