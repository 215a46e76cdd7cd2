"""M_Keys (IBA 14.2.4): the key each end port should hold, the key it holds as far as this SM knows,
the key every SMP carries, and the files that keep them across restarts.

An SMP is checked by the SMA it is addressed to (a CA port, or a switch's port 0 for any port of the
switch), so it carries the M_Key of that port: the last node of a directed route. :class:`MKeys`
holds, per port GUID, the key the port holds as far as we know (from the guid2mkey file, from
PortInfo reads that show it, from the answer of each Set that changed it) and the key it should hold
(``sm.m_key``; with ``sm.m_key_per_port``, a BLAKE2b MAC of the port GUID under ``sm.m_key`` as the
secret, 64 bits). A port we know nothing of is sent the key it should hold.

What OpenSM does (linux-rdma/opensm), and how it carries over:

- ``osm_req.c`` (``req_determine_mkey``): with ``m_key_lookup`` (default TRUE) a directed-route SMP
  carries the key guid2mkey holds for the port at the end of its path, found over the subnet as
  known or, for a port not known yet, from the neighbors database (``osm_db_neighbor``: which port
  is behind which, kept across restarts); without an entry, ``m_key``. Here always so; a port not
  known at all is tried first with the keys the ports hold when those are few (one key for all, the
  old one after a change of ``sm.m_key``), and a port that does not answer with the first key is
  tried once with each other key we have for it before it is called locked.
- ``osm_lid_mgr.c`` (``lid_mgr_set_physp_pi``): PortInfo Sets give every end port ``m_key``,
  ``m_key_protection_level`` and ``m_key_lease_period`` where it holds other values, carry the key
  the port held, and guid2mkey takes the new key "on the assumption that the SubnSet succeeds";
  here the Set's GetResp says whether it did.
- ``osm_port.c`` (``osm_physp_set_port_info``): a PortInfo read records its M_Key when that is not 0
  or the protect bits are 0 (at protection level 1 a Get with a wrong key reads the M_Key as 0).
- ``osm_state_mgr.c`` stores guid2mkey and neighbors after each sweep; ``osm_subnet.c`` drops GUID 0
  entries at start; ``osm_db_pack.c``: ``0x%016x 0x%016x`` per port GUID, and
  ``0x<guid>:<port> 0x<guid>:<port>`` per link end.
- ``m_key_lease_period`` is in seconds (``osm_subnet.c``: "in [sec]"), as PortInfo.M_KeyLeasePeriod.
- Upstream OpenSM sets one ``m_key`` on every port; per-port keys (``m_key_per_port``) come with
  NVIDIA's builds. Ours are a keyed hash, reproducible from the secret and the GUID alone.

Both files are written atomically, only when they change; a rewrite that drops or changes an entry
keeps the previous file as ``NAME.bak``, as the guid2lid file (``sm/sweep/lids.py``); a bad line costs
that line only, named by file, line and column. The neighbors file sits beside guid2mkey: named
``neighbors`` beside a file named ``guid2mkey`` (OpenSM's cache directory), else ``NAME.neighbors``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from fabric.errors import IbfmError
from fabric.fileio import db_lines, keep_before_loss, remove_stale_temps, write_text_atomic
from fabric.mad import PORT_INFO, Method, SmpAttr
from fabric.model import Fabric, NodeType
from sm.transport.base import WindowedTransport
from sm.transport.smp import RowCodec, smp_batch_dr

M_KEY_MAX = (1 << 64) - 1
LEASE_MAX = 0xFFFF
"""PortInfo.M_KeyLeasePeriod is 16 bits of seconds."""
FEW_KEYS = 4
"""A port not known yet is tried with the keys the ports hold when there are at most this many."""
_PORT_INFO = RowCodec(PORT_INFO)


class MKeyError(IbfmError):
    """A guid2mkey or neighbors file that cannot be read or written, or M_Key settings that do not fit."""


def derive_m_key(secret: int, port_guid: int) -> int:
    """The per-port M_Key of ``port_guid`` under ``secret`` (``sm.m_key``): BLAKE2b keyed with the secret,
    64 bits; never 0 (0 would leave the port unprotected)."""
    h = hashlib.blake2b(port_guid.to_bytes(8, "big"), key=secret.to_bytes(8, "big"), digest_size=8, person=b"ibfm-mkey")
    return int.from_bytes(h.digest(), "big") or 1


# -- the files ---------------------------------------------------------------------------------------------

K = TypeVar("K")
V = TypeVar("V")


def _guid(text: str) -> int:
    g = int(text, 16)
    if not 0 < g <= M_KEY_MAX:
        raise ValueError(f"GUID {text} outside 1..2^64-1")
    return g


def _mkey(text: str) -> int:
    k = int(text, 16)
    if not 0 <= k <= M_KEY_MAX:
        raise ValueError(f"M_Key {text} does not fit 64 bits")
    return k


def _port_end(text: str) -> tuple[int, int]:
    guid, sep, port = text.partition(":")
    if not sep:
        raise ValueError(f"{text!r} is not 0x<guid>:<port>")
    p = int(port, 0)
    if not 0 <= p <= 254:
        raise ValueError(f"port {port} outside 0..254")
    return _guid(guid), p


@dataclass(frozen=True)
class _Format(Generic[K, V]):
    what: str
    key: Callable[[str], K]
    value: Callable[[str], V]
    line: Callable[[K, V], str]
    expect: str


GUID2MKEY = _Format[int, int](
    "guid2mkey", _guid, _mkey, lambda g, k: f"0x{g:016x} 0x{k:016x}", "0x<port guid> 0x<m_key>"
)
NEIGHBORS = _Format[tuple[int, int], tuple[int, int]](
    "neighbors",
    _port_end,
    _port_end,
    lambda a, b: f"0x{a[0]:016x}:{a[1]} 0x{b[0]:016x}:{b[1]}",
    "0x<port guid>:<port> 0x<port guid>:<port>",
)


def read_db(path: str | os.PathLike[str], fmt: _Format[K, V]) -> tuple[dict[K, V], list[str]]:
    """One of OpenSM's database files (``key value`` per line); (entries, one warning per line not kept).

    Read line by line on bytes: a stray byte or a bad value costs its own line, named by file, line
    and column. A missing file is empty."""
    p = Path(path)
    entries: dict[K, V] = {}
    lines, warnings = db_lines(p, fmt.what, MKeyError)
    for n, s in lines:
        parts = s.split()
        if not parts:
            continue
        col = len(s) - len(s.lstrip()) + 1
        try:
            if len(parts) != 2:
                raise ValueError(f"expected '{fmt.expect}'")
            key = fmt.key(parts[0])
            col = s.index(parts[1], col) + 1
            value = fmt.value(parts[1])
        except ValueError as e:
            warnings.append(f"{p}:{n}:{col}: {e}; entry ignored")
            continue
        if key in entries:
            warnings.append(f"{p}:{n}:1: {parts[0]} listed twice; first entry kept")
            continue
        entries[key] = value
    return entries, warnings


class _DbFile(Generic[K, V]):
    """One database file: loaded once, written atomically when what it should hold changes."""

    def __init__(self, path: Path | None, fmt: _Format[K, V]) -> None:
        self.path = path
        self.fmt = fmt
        self.entries: dict[K, V] = {}
        """What the file holds (its kept lines)."""
        self.warnings: list[str] = []
        if path is not None:
            remove_stale_temps(path)
            self.entries, self.warnings = read_db(path, fmt)
        self._lines_ignored = bool(self.warnings)

    def save(self, entries: dict[K, V]) -> list[str]:
        """Make the file hold ``entries``: nothing when it does already; a rewrite that drops or changes
        anything first keeps the old file as ``NAME.bak``. Returns what to tell the operator."""
        if self.path is None:
            self.entries = dict(entries)
            return []
        if not self._lines_ignored and entries == self.entries:
            return []
        notes: list[str] = []
        if self._lines_ignored or any(entries.get(k) != v for k, v in self.entries.items()):
            note = keep_before_loss(self.path, self.fmt.what, MKeyError)
            if note:
                notes.append(note)
        # Each entry ends with a blank line, as OpenSM's osm_db_store writes it (its reader appends every
        # non-blank line to the previous key's value).
        body = "".join(f"{self.fmt.line(k, v)}\n\n" for k, v in sorted(entries.items()))  # type: ignore[type-var]
        try:
            write_text_atomic(self.path, body)
        except OSError as e:
            raise MKeyError(f"{self.path}: cannot write the {self.fmt.what} file: {e.strerror or e}") from e
        self.entries = dict(entries)
        self._lines_ignored = False
        return notes


def neighbors_path(guid2mkey: Path) -> Path:
    """Where the neighbors file goes beside ``guid2mkey``."""
    if guid2mkey.name == "guid2mkey":
        return guid2mkey.with_name("neighbors")
    return guid2mkey.with_name(guid2mkey.name + ".neighbors")


# -- the keys ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LockedPort:
    """A port that answered no SMP carrying any key we have for it."""

    where: str
    """Named for the operator: the port behind which it sits, or the port itself."""
    route: tuple[int, ...]
    guid: int | None = None
    """Its port GUID, when known (from an earlier discovery or the neighbors file)."""
    lease: int | None = None
    """Its M_KeyLeasePeriod as last read, when known."""

    @property
    def hops(self) -> int:
        return len(self.route)


class MKeys:
    """What M_Key each end port holds and should hold; the key of every SMP; the guid2mkey file.

    ``key`` 0 and no port known to hold a key: :attr:`active` is False, and the sweeps build their
    SMPs as before, with no M_Key step at all.
    """

    def __init__(
        self,
        *,
        key: int = 0,
        per_port: bool = False,
        protect: int = 0,
        lease: int = 0,
        path: Path | None = None,
    ) -> None:
        if not 0 <= key <= M_KEY_MAX:
            raise MKeyError(f"M_Key {key:#x} does not fit 64 bits")
        if not 0 <= protect <= 3:
            raise MKeyError(f"M_Key protection level {protect} outside 0..3")
        if not 0 <= lease <= LEASE_MAX:
            raise MKeyError(f"M_Key lease period {lease} s outside 0..{LEASE_MAX}")
        self.key = key
        self.per_port = per_port and bool(key)
        """Keys per port, derived from ``key`` (no keys at all while ``key`` is 0)."""
        self.protect = protect
        self.lease = lease
        self._file = _DbFile(path, GUID2MKEY)
        self._nfile = _DbFile(neighbors_path(path) if path is not None else None, NEIGHBORS)
        self.warnings: list[str] = [*self._file.warnings, *self._nfile.warnings]
        """What the files held that could not be used (logged by the manager)."""
        self.held: dict[int, int] = {g: k for g, k in self._file.entries.items()}
        """Port GUID -> the M_Key it holds as far as we know."""
        self.neighbors: dict[tuple[int, int], tuple[int, int]] = dict(self._nfile.entries)
        """(port GUID, port number) -> (port GUID, port number) of the port behind it (the end port that
        answers: a switch's port 0 GUID)."""
        self._derived: dict[int, int] = {}
        self._nonzero = sum(1 for k in self.held.values() if k)
        self._gen = 0
        self._cache: tuple[Fabric, int, npt.NDArray[np.uint64]] | None = None
        self._few: tuple[int, list[int]] | None = None
        self.own_guid = 0
        """Our own port's GUID (hop 0), when the transport knows it before the first discovery."""
        self.ignored: set[int] = set()
        """Port GUIDs that do not keep M_Key fields (ibsim): not keyed, not asked again."""

    @property
    def path(self) -> Path | None:
        return self._file.path

    @property
    def active(self) -> bool:
        """Some key is in play: ours is set, or some port holds one."""
        return bool(self.key or self._nonzero)

    @property
    def protecting(self) -> bool:
        """Ports are keyed and their keys are checked (level 0 checks Sets)."""
        return bool(self.key)

    def want(self, guid: int) -> int:
        """The M_Key port ``guid`` should hold."""
        if not self.per_port:
            return self.key
        k = self._derived.get(guid)
        if k is None:
            k = self._derived[guid] = derive_m_key(self.key, guid)
        return k

    def holds(self, guid: int) -> int:
        """The M_Key to send port ``guid``: the one it holds as far as we know, else the one it should hold."""
        k = self.held.get(guid)
        return self.want(guid) if k is None else k

    def candidates(self, guid: int | None) -> list[int]:
        """Keys to try, in order, on a port that may be ``guid`` (None: unknown): the one it holds as far as
        we know and the one it should hold; for a port not known, the keys the ports hold when they are few
        (one key for all; after a change in the settings the file's keys are the old one); then the
        configured key. No 0, no repeats."""
        out = [self.holds(guid), self.want(guid)] if guid is not None else self._few_held()
        return [k for k in dict.fromkeys([*out, self.key]) if k]

    def _few_held(self) -> list[int]:
        """The distinct keys ports hold, when they are few (one key for all, or two during a change)."""
        if self._few is None or self._few[0] != self._gen:
            distinct = {k for k in self.held.values() if k}
            self._few = (self._gen, sorted(distinct) if len(distinct) <= FEW_KEYS else [])
        return self._few[1]

    def behind(self, port_guid: int, port: int) -> int | None:
        """The port GUID behind port ``port`` of the port with GUID ``port_guid`` (a switch: its port 0's
        GUID), as the last discovery or the neighbors file says; None when unknown."""
        peer = self.neighbors.get((port_guid, port))
        return None if peer is None else peer[0]

    # -- keys as arrays, for batches -------------------------------------------------------------------------

    def port_keys(self, f: Fabric) -> npt.NDArray[np.uint64]:
        """``[node, port]`` -> the M_Key an SMP to that port carries (a switch's row: its port 0's key)."""
        c = self._cache
        if c is not None and c[0] is f and c[1] == self._gen:
            return c[2]
        ep, guids = _end_ports(f)
        values = self._want_of(guids)
        if self.held:  # what a port holds as far as we know, else what it should hold
            held = np.fromiter(self.held, np.uint64, len(self.held))
            order = np.argsort(held)
            held = held[order]
            at = np.minimum(np.searchsorted(held, guids), held.size - 1)
            known = np.fromiter(self.held.values(), np.uint64, len(self.held))[order][at]
            values = np.where(held[at] == guids, known, values)
        keys = self._spread(f, ep, values)
        self._cache = (f, self._gen, keys)
        return keys

    def _want_of(self, guids: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        """The key each of ``guids`` should hold."""
        if not self.per_port:
            return np.full(guids.shape, self.key, np.uint64)
        want = self.want
        return np.fromiter((want(g) for g in guids.tolist()), np.uint64, guids.size)

    @staticmethod
    def _spread(f: Fabric, ep: npt.NDArray[np.intp], values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        """``values`` (one per end port of ``ep``) as a ``[node, port]`` array, a switch's over its whole row."""
        keys = np.zeros(f.port_guid.shape, np.uint64)
        sw = f.node_type[ep[:, 0]] == NodeType.SWITCH
        keys[ep[sw, 0], :] = values[sw, None]
        keys[ep[~sw, 0], ep[~sw, 1]] = values[~sw]
        return keys

    def rows(self, f: Fabric, nodes: npt.ArrayLike, ports: npt.ArrayLike | int = 0) -> npt.NDArray[np.uint64] | None:
        """The M_Key of each SMP to ``(nodes[r], ports[r])`` (a switch: any port); None when no key is in play."""
        if not self.active:
            return None
        return self.port_keys(f)[np.asarray(nodes, np.intp), np.asarray(ports, np.intp)]

    def row_list(self, f: Fabric, nodes: Sequence[int], ports: Sequence[int] | int = 0) -> list[int] | None:
        """:meth:`rows` as a list of ints (for ``smp_batch``)."""
        keys = self.rows(f, list(nodes), ports if isinstance(ports, int) else list(ports))
        return None if keys is None else keys.tolist()

    def want_keys(self, f: Fabric) -> npt.NDArray[np.uint64]:
        """``[node, port]`` -> the M_Key the end port should hold (a switch's row: its port 0's)."""
        ep, guids = _end_ports(f)
        return self._spread(f, ep, self._want_of(guids))

    def ignored_mask(self, f: Fabric) -> npt.NDArray[np.bool_]:
        """``[node, port]``: end ports that do not keep M_Key fields (a switch: its port 0)."""
        mask = np.zeros(f.port_guid.shape, bool)
        if self.ignored:
            ep = f.endports()
            hit = np.isin(f.port_guid[ep[:, 0], ep[:, 1]], np.fromiter(self.ignored, np.uint64, len(self.ignored)))
            mask[ep[hit, 0], ep[hit, 1]] = True
        return mask

    # -- learning ------------------------------------------------------------------------------------------

    def record(self, guid: int, key: int) -> bool:
        """Port ``guid`` holds ``key`` (a Set it took, or a read that shows it); whether that is news."""
        old = self.held.get(guid)
        if old == key:
            return False
        self.held[guid] = key
        self._nonzero += bool(key) - bool(old)
        self._gen += 1
        return True

    def learn(self, f: Fabric, where: Sequence[tuple[int, int]], rows: npt.NDArray[np.uint8]) -> int:
        """Take the M_Keys that PortInfo bytes ``rows[k]``, read at ``where[k]``, show: end ports only (switch
        port 0, CA ports), and only where the key is not 0 or the protect bits are 0 (a Get with a wrong
        key at level 1 reads the key as 0), as OpenSM's osm_physp_set_port_info. How many changed."""
        if not len(where):
            return 0
        n, p = np.asarray(where, np.intp).reshape(-1, 2).T
        end = (f.node_type[n] != NodeType.SWITCH) | (p == 0)
        key = _PORT_INFO.column(rows, "M_Key")
        shown = end & ((key != 0) | (_PORT_INFO.column(rows, "M_KeyProtectBits") == 0))
        if not self.active:
            shown &= key != 0  # M_Key off and every key 0: nothing to learn
        at = np.flatnonzero(shown)
        if not at.size:
            return 0
        changed = 0
        for g, k in zip(f.port_guid[n[at], p[at]].tolist(), key[at].tolist(), strict=True):
            changed += self.record(g, k)
        return changed

    def learn_links(self, f: Fabric) -> int:
        """Which port is behind which, from a discovery: both ends of every link; how many changed."""
        guid = f.port_guid
        sw = f.node_type == NodeType.SWITCH
        changed = 0
        for a, b, c, d in f.link_array().tolist():
            ga = int(guid[a, 0 if sw[a] else b])
            gc = int(guid[c, 0 if sw[c] else d])
            for key, val in (((ga, b), (gc, d)), ((gc, d), (ga, b))):
                if self.neighbors.get(key) != val:
                    self.neighbors[key] = val
                    changed += 1
        return changed

    def save(self) -> list[str]:
        """Write guid2mkey (and neighbors) where they changed: every port holding a key, and every port the
        file listed (a key set back to 0 stays, as 0). What to tell the operator (.bak kept)."""
        entries = {g: k for g, k in self.held.items() if k or g in self._file.entries}
        notes = self._file.save(entries)
        if entries or self._nfile.entries:  # the neighbors matter only where keys are kept
            notes += self._nfile.save(self.neighbors)
        return notes

    def key_of_route(self, guid: int | None) -> int:
        """The key an SMP to a port that may be ``guid`` carries (None: not known yet)."""
        return self.key if guid is None else self.holds(guid)

    def lease_wait(self, locked: Iterable[LockedPort]) -> tuple[int, int]:
        """(lease in seconds, deepest hop count) of ``locked``: the longest lease known for them (as last
        read, else ``sm.m_key_lease_period``) and how deep the deepest is."""
        ports = list(locked)
        lease = max([self.lease, *(x.lease for x in ports if x.lease is not None)])
        return lease, max((x.hops for x in ports), default=0)


def _end_ports(f: Fabric) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.uint64]]:
    """Every end port (node, port) of ``f``, and its port GUID."""
    ep = f.endports()
    return ep, f.port_guid[ep[:, 0], ep[:, 1]].astype(np.uint64)


async def touch_ports(
    transport: WindowedTransport,
    f: Fabric,
    paths: Sequence[tuple[int, ...] | None],
    port_paths: dict[tuple[int, int], tuple[int, ...]],
    keys: MKeys,
    ports: Sequence[tuple[int, int]],
) -> list[tuple[int, int]]:
    """A PortInfo Get carrying its key to each of ``ports`` (end ports, by (node, port)): a passing M_Key
    check stops a running lease timer (IBA 14.2.4.2). Returns the ports that did not answer."""
    routes: list[tuple[int, ...]] = []
    targets: list[tuple[int, int]] = []
    for n, p in ports:
        path = port_paths.get((n, p)) if not f.is_switch(n) else paths[n]
        if path is None:
            path = paths[n]
        if path is None:
            continue
        routes.append(path)
        targets.append((n, p))
    if not routes:
        return []
    nodes = [n for n, _ in targets]
    mkeys = keys.rows(f, nodes, [p for _, p in targets])
    res = await smp_batch_dr(
        transport, Method.GET, SmpAttr.PORT_INFO, routes, np.arange(len(routes)), 0, mkeys=mkeys, resend=1
    )
    ok = np.flatnonzero(res.ok)
    if ok.size:
        keys.learn(f, [targets[i] for i in ok.tolist()], res.data[ok])
    return [targets[i] for i in np.flatnonzero(~res.ok).tolist()]
