"""SMP Get/Set over a transport, with status checks that name the target.

A route is a directed-route path (tuple of output ports) or a LID; the
request is built as a DR or a LID-routed SMP accordingly. A non-zero
status raises :class:`SmpError` naming route, attribute and status.

Two batch paths, the same MADs and checks: :func:`smp_batch` takes one
request tuple per SMP (mixed routes, methods and attributes) and joins each
MAD from cached pieces; :func:`smp_batch_dr` takes directed-route SMPs as
arrays (path index, modifier, data per row) and builds and checks them as one
(rows, 256) array, for the big stages (LFT blocks, PortInfo Sets, discovery
levels). :class:`RowCodec` reads and writes attribute fields over such rows.

Every SMP carries the M_Key of the port it addresses (bytes 24..31; IBA
14.2.4), given per request (``mkeys``): one vectorized write into the batch
array for :func:`smp_batch_dr`, a cached header tail per key for
:func:`smp_batch`. Without ``mkeys`` the key is 0 and nothing is done per SMP.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fabric.errors import IbfmError
from fabric.mad import (
    BASE_VERSION,
    DATA_OFFSET,
    INITIAL_PATH_OFFSET,
    MAD_SIZE,
    MAX_DR_HOPS,
    SMP_DATA_SIZE,
    Layout,
    Method,
    MgmtClass,
    parse_mad,
    smp_dr,
    smp_lid,
)
from fabric.mad.constants import SMP_CLASS_VERSION
from fabric.mad.fields import FieldValue
from sm.transport.base import MadTimeout, Route, WindowedTransport, describe_route

RESEND_ROUNDS = 2
"""Rounds in which a batch sends again the requests that timed out after all the transport's retries.

On a lossy fabric (a MAD dropped now and then at each hop) a few of
thousands of SMPs exhaust their retries; sending only those once more, as a
fresh batch, brings a stage through at little cost. A request that times out
every round is a device that is gone, and costs (retries + 1) x timeout a round.
"""


class SmpError(IbfmError):
    """An SMP answered with a bad status or an unexpected layout."""


async def smp_get_raw(
    transport: WindowedTransport, route: Route, attr_id: int, attr_mod: int = 0, data: bytes = b"", *, mkey: int = 0
) -> bytes:
    """Send a Get; returns the attribute data of the GetResp (64 bytes)."""
    return await _exchange(transport, route, Method.GET, attr_id, attr_mod, data, mkey)


async def smp_set_raw(
    transport: WindowedTransport, route: Route, attr_id: int, attr_mod: int, data: bytes, *, mkey: int = 0
) -> bytes:
    """Send a Set; returns the attribute data of the GetResp (the device's state after it)."""
    return await _exchange(transport, route, Method.SET, attr_id, attr_mod, data, mkey)


async def smp_get(
    transport: WindowedTransport, route: Route, layout: Layout, attr_id: int, attr_mod: int = 0, *, mkey: int = 0
) -> dict[str, FieldValue]:
    return layout.unpack(await smp_get_raw(transport, route, attr_id, attr_mod, mkey=mkey))


async def _exchange(
    transport: WindowedTransport, route: Route, method: int, attr_id: int, attr_mod: int, data: bytes, mkey: int
) -> bytes:
    request = (route, method, attr_id, attr_mod, data[:SMP_DATA_SIZE])
    (res,) = await smp_batch(transport, [request], mkeys=[mkey] if mkey else None)
    if isinstance(res, IbfmError):
        raise res
    return res


SmpRequest = tuple[Route, int, int, int, bytes]
"""(route, method, attribute ID, attribute modifier, data)."""

_U16 = struct.Struct(">H")
_DR_TAIL = bytes(8) + b"\xff\xff\xff\xff" + bytes(DATA_OFFSET - 36)
"""DR SMP bytes 24..63: M_Key 0, DrSLID and DrDLID permissive, reserved."""
M_KEY_OFFSET = 24
"""Where an SMP carries its M_Key (8 bytes, big-endian)."""
_M_KEY_MAX = (1 << 64) - 1
_SUBN_DR = int(MgmtClass.SUBN_DR)
_SUBN_LID = int(MgmtClass.SUBN_LID)


def _dr_paths_block(path: tuple[int, ...]) -> bytes:
    """InitialPath (slots 1..hop count) and an empty ReturnPath: bytes 128..255 of a DR SMP."""
    if len(path) > MAX_DR_HOPS:
        raise ValueError(path)
    return (b"\0" + bytes(path)).ljust(MAD_SIZE - INITIAL_PATH_OFFSET, b"\0")


def build_smps(requests: Sequence[SmpRequest], mkeys: Sequence[int] | None = None) -> list[tuple[bytes, Route]]:
    """The request MADs (TID 0) of ``requests``, ready for ``send_many``.

    Directed-route SMPs are joined from cached pieces (header per method,
    attribute and hop count; path bytes per path; with ``mkeys``, the key
    and the rest of bytes 24..63 per key), byte for byte what
    :func:`~fabric.mad.smp_dr` builds; anything odd goes through the
    checked builders, which name the problem. ``mkeys[i]`` is the M_Key of
    request ``i`` (None: 0 for all).
    """
    if mkeys is not None and len(mkeys) != len(requests):
        raise ValueError(f"{len(mkeys)} M_Keys for {len(requests)} requests")
    heads: dict[tuple[int, int, int], bytes] = {}
    paths: dict[tuple[int, ...], bytes] = {}
    tails: dict[int, bytes] = {0: _DR_TAIL}
    join = b"".join
    out: list[tuple[bytes, Route]] = []
    append = out.append
    for i, (route, method, attr_id, attr_mod, data) in enumerate(requests):
        mkey = mkeys[i] if mkeys is not None else 0
        if isinstance(route, int):
            append((smp_lid(method, attr_id, attr_mod, 0, data, mkey), route))
            continue
        try:
            key = (method, attr_id, len(route))
            head = heads.get(key)
            if head is None:
                head = heads[key] = (
                    bytes((BASE_VERSION, _SUBN_DR, SMP_CLASS_VERSION, method, 0, 0, 0, len(route)))
                    + bytes(8)
                    + _U16.pack(attr_id)
                    + b"\0\0"
                )
            block = paths.get(route)
            if block is None:
                block = paths[route] = _dr_paths_block(route)
            tail = tails.get(mkey)
            if tail is None:
                if not 0 <= mkey <= _M_KEY_MAX:
                    raise ValueError(mkey)
                tail = tails[mkey] = mkey.to_bytes(8, "big") + _DR_TAIL[8:]
            if len(data) != SMP_DATA_SIZE:
                if len(data) > SMP_DATA_SIZE:
                    raise ValueError(data)
                data = data.ljust(SMP_DATA_SIZE, b"\0")
            append((join((head, attr_mod.to_bytes(4, "big"), tail, data, block)), route))
        except (ValueError, OverflowError, TypeError, AttributeError, struct.error):
            append((smp_dr(method, attr_id, attr_mod, 0, route, data, mkey), route))  # raises MadError naming it
    return out


async def send_resending(
    transport: WindowedTransport, requests: Sequence[tuple[bytes, Route]], resend: int = RESEND_ROUNDS
) -> list[bytes | IbfmError]:
    """``transport.send_many``, then up to ``resend`` more rounds for the requests that timed out.

    A Set whose answer was lost is sent again as is: the caller checks what
    the device holds when such a Set is refused (it may have been taken the
    first time).
    """
    answers = await transport.send_many(requests)
    for _ in range(resend):
        lost = [i for i, a in enumerate(answers) if isinstance(a, MadTimeout)]
        if not lost:
            break
        transport.stats.resent += len(lost)
        for i, a in zip(lost, await transport.send_many([requests[i] for i in lost]), strict=True):
            answers[i] = a
    return answers


async def smp_batch(
    transport: WindowedTransport,
    requests: list[SmpRequest],
    *,
    resend: int = RESEND_ROUNDS,
    mkeys: Sequence[int] | None = None,
) -> list[bytes | IbfmError]:
    """Send every SMP under the window; per request the attribute data, or the error naming it.

    ``resend``: rounds for requests that timed out (:func:`send_resending`). ``mkeys``: the M_Key
    each request carries (the key of the port it addresses); None: 0.
    """
    answers = await send_resending(transport, build_smps(requests, mkeys), resend)
    out: list[bytes | IbfmError] = []
    append = out.append
    for (route, method, attr_id, attr_mod, _), ans in zip(requests, answers, strict=True):
        # The common case read straight off the bytes: a whole MAD of the class sent, the
        # attribute asked for, status 0 (DR: the D bit is not status) and a sane hop count.
        if (
            type(ans) is bytes
            and len(ans) == MAD_SIZE
            and ans[0] == BASE_VERSION
            and ans[16] == attr_id >> 8
            and ans[17] == attr_id & 0xFF
            and not ans[5]
            and (
                (ans[1] == _SUBN_DR and not ans[4] & 0x7F and ans[7] <= MAX_DR_HOPS and ans[6] <= ans[7] + 1)
                or (ans[1] == _SUBN_LID and not ans[4])
            )
        ):
            append(ans[DATA_OFFSET : DATA_OFFSET + SMP_DATA_SIZE])
        else:
            append(_check_answer(route, method, attr_id, attr_mod, ans))
    return out


def _check_answer(route: Route, method: int, attr_id: int, attr_mod: int, ans: object) -> bytes | IbfmError:
    """The full check of an answer, naming what is wrong."""
    if not isinstance(ans, bytes):
        return ans if isinstance(ans, IbfmError) else SmpError(f"{describe_route(route)}: {ans}")
    try:
        resp = parse_mad(ans)
    except IbfmError as e:
        return SmpError(f"{describe_route(route)}: malformed answer: {e}")
    if resp.attr_id != attr_id or resp.status:
        return SmpError(
            f"{describe_route(route)}: {'Set' if method == Method.SET else 'Get'} of attribute "
            f"{attr_id:#06x} modifier {attr_mod:#x} answered status {resp.status:#06x}"
            + (f" for attribute {resp.attr_id:#06x}" if resp.attr_id != attr_id else "")
        )
    return resp.data


@dataclass
class SmpAnswers:
    """Answers of :func:`smp_batch_dr`, one row per request."""

    ok: npt.NDArray[np.bool_]
    """Answered with status 0 for the attribute asked."""
    data: npt.NDArray[np.uint8]
    """(rows, 64) attribute data; zero where not ``ok``."""
    errors: dict[int, IbfmError]
    """Row -> the error naming route, attribute and status, for every row not ``ok``."""


_NO_ANSWER = bytes(MAD_SIZE)


def _path_blocks(
    paths: Sequence[tuple[int, ...]], used: npt.NDArray[np.intp], method: int, attr_id: int
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """InitialPath (slots 1..hop count) of ``paths[used[k]]`` as rows of a (k, 128) array, and the hop counts."""
    chosen = [paths[w] for w in used.tolist()]
    hops = np.fromiter(map(len, chosen), np.intp, len(chosen))
    block = np.zeros((len(chosen), MAD_SIZE - INITIAL_PATH_OFFSET), np.uint8)
    total = int(hops.sum())
    try:
        if hops.size and int(hops.max()) > MAX_DR_HOPS:
            raise ValueError("too many hops")
        ports = np.fromiter(itertools.chain.from_iterable(chosen), np.int64, total)
        if total and (ports.min() < 0 or ports.max() > 255):
            raise ValueError("port out of range")
    except (ValueError, TypeError, OverflowError):
        for path in chosen:  # find the one to name
            try:
                _dr_paths_block(tuple(path))
            except (ValueError, TypeError, OverflowError):
                smp_dr(method, attr_id, 0, 0, path)  # raises MadError naming the path
        raise
    starts = np.cumsum(hops) - hops
    rows = np.repeat(np.arange(len(chosen)), hops)
    block[rows, 1 + np.arange(total) - np.repeat(starts, hops)] = ports
    return block, hops.astype(np.uint8)


SMP_CHUNK = 1 << 15
"""Rows of :func:`smp_batch_dr` built, sent and checked at a time: the MADs, their bytes and the
answers of a chunk live together (about 30 MB at this size, not 300 MB for a fabric's LFT blocks)."""


async def smp_batch_dr(
    transport: WindowedTransport,
    method: int,
    attr_id: int | npt.NDArray[np.integer[Any]],
    paths: Sequence[tuple[int, ...]],
    which: npt.NDArray[np.integer[Any]],
    attr_mod: npt.NDArray[np.integer[Any]] | int = 0,
    data: npt.NDArray[np.uint8] | None = None,
    *,
    resend: int = RESEND_ROUNDS,
    mkeys: npt.NDArray[np.uint64] | int | None = None,
) -> SmpAnswers:
    """Directed-route SMPs of one method, one per row, built and checked as arrays.

    Row ``r`` asks for attribute ``attr_id`` (or ``attr_id[r]``) along
    ``paths[which[r]]`` with modifier ``attr_mod[r]``, data ``data[r]`` (64
    bytes) and M_Key ``mkeys[r]`` (or ``mkeys`` for every row; None: 0). The
    256-byte MADs are written as one (rows, 256) array per :data:`SMP_CHUNK`
    rows, the answers read back as one; only rows that failed are looked at
    one by one, to name what went wrong. Same MADs, same checks as
    :func:`smp_batch`.
    """
    rows: npt.NDArray[np.intp] = np.asarray(which, np.intp)
    n = rows.shape[0]
    if n <= SMP_CHUNK:
        return await _smp_rows_dr(transport, method, attr_id, paths, rows, attr_mod, data, resend, mkeys)

    def cut(v: Any, lo: int, hi: int) -> Any:
        return v[lo:hi] if isinstance(v, np.ndarray) and v.ndim >= 1 and v.shape[0] == n else v

    parts: list[SmpAnswers] = []
    for lo in range(0, n, SMP_CHUNK):
        hi = min(n, lo + SMP_CHUNK)
        parts.append(await _smp_rows_dr(
            transport, method, cut(attr_id, lo, hi), paths, rows[lo:hi], cut(attr_mod, lo, hi),
            cut(data, lo, hi), resend, cut(mkeys, lo, hi),
        ))  # fmt: skip
    errors = {lo + r: e for lo, part in zip(range(0, n, SMP_CHUNK), parts, strict=True) for r, e in part.errors.items()}
    return SmpAnswers(np.concatenate([p.ok for p in parts]), np.concatenate([p.data for p in parts]), errors)


async def _smp_rows_dr(
    transport: WindowedTransport,
    method: int,
    attr_id: int | npt.NDArray[np.integer[Any]],
    paths: Sequence[tuple[int, ...]],
    which: npt.NDArray[np.intp],
    attr_mod: npt.NDArray[np.integer[Any]] | int,
    data: npt.NDArray[np.uint8] | None,
    resend: int,
    mkeys: npt.NDArray[np.uint64] | int | None,
) -> SmpAnswers:
    """:func:`smp_batch_dr` of one chunk."""
    n = which.shape[0]
    if n == 0:
        return SmpAnswers(np.zeros(0, bool), np.zeros((0, SMP_DATA_SIZE), np.uint8), {})
    attrs = np.broadcast_to(np.asarray(attr_id, np.int64), (n,))
    if attrs.min() < 0 or attrs.max() > 0xFFFF:
        smp_dr(method, int(attrs[(attrs < 0) | (attrs > 0xFFFF)][0]), 0, 0, ())  # raises MadError
    used, slot = np.unique(which, return_inverse=True)
    block, hops = _path_blocks(paths, used, method, int(attrs[0]))
    mads = np.zeros((n, MAD_SIZE), np.uint8)
    mads[:, :4] = (BASE_VERSION, _SUBN_DR, SMP_CLASS_VERSION, method)
    mads[:, 7] = hops[slot]
    mads[:, 16] = attrs >> 8
    mads[:, 17] = attrs & 0xFF
    mods = np.broadcast_to(np.asarray(attr_mod, np.int64), (n,))
    if mods.min() < 0 or mods.max() > 0xFFFFFFFF:
        smp_dr(method, int(attrs[0]), int(mods[(mods < 0) | (mods > 0xFFFFFFFF)][0]), 0, ())  # raises MadError
    mads[:, 20:24] = mods.astype(">u4").view(np.uint8).reshape(n, 4)
    mads[:, 32:36] = 0xFF  # DrSLID, DrDLID permissive
    if mkeys is not None:
        mads[:, M_KEY_OFFSET : M_KEY_OFFSET + 8] = _key_bytes(mkeys, n)
    if data is not None:
        mads[:, DATA_OFFSET : DATA_OFFSET + SMP_DATA_SIZE] = data
    mads[:, INITIAL_PATH_OFFSET:] = block[slot]
    blob = mads.tobytes()
    wl = which.tolist()
    reqs = [(blob[i * MAD_SIZE : (i + 1) * MAD_SIZE], paths[w]) for i, w in enumerate(wl)]
    answers = await send_resending(transport, reqs, resend)
    got = np.frombuffer(
        b"".join(a if type(a) is bytes and len(a) == MAD_SIZE else _NO_ANSWER for a in answers), np.uint8
    ).reshape(n, MAD_SIZE)
    ok = (
        (got[:, 0] == BASE_VERSION)
        & (got[:, 1] == _SUBN_DR)
        & (got[:, 16] == attrs >> 8)
        & (got[:, 17] == attrs & 0xFF)
        & (got[:, 4] & 0x7F == 0)
        & (got[:, 5] == 0)
        & (got[:, 7] <= MAX_DR_HOPS)
        & (got[:, 6] <= got[:, 7].astype(np.int16) + 1)
    )
    out = np.where(ok[:, None], got[:, DATA_OFFSET : DATA_OFFSET + SMP_DATA_SIZE], 0).astype(np.uint8)
    errors: dict[int, IbfmError] = {}
    for r in np.flatnonzero(~ok).tolist():
        res = _check_answer(paths[wl[r]], method, int(attrs[r]), int(mods[r]), answers[r])
        if isinstance(res, bytes):  # (cannot happen: the fast check is the full one's subset)
            ok[r] = True
            out[r] = np.frombuffer(res, np.uint8)
        else:
            errors[r] = res
    return SmpAnswers(ok, out, errors)


def stamp_m_key(mad: bytes, mkey: int) -> bytes:
    """SMP ``mad`` (built elsewhere, e.g. by :func:`~fabric.mad.smp_dr`) carrying M_Key ``mkey`` instead."""
    if not mkey:
        return mad
    return mad[:M_KEY_OFFSET] + mkey.to_bytes(8, "big") + mad[M_KEY_OFFSET + 8 :]


def _key_bytes(mkeys: npt.NDArray[np.uint64] | int, n: int) -> npt.NDArray[np.uint8]:
    """M_Keys as the (n, 8) or (1, 8) big-endian bytes an SMP carries them in; MadError for a bad one."""
    if isinstance(mkeys, int):
        if not 0 <= mkeys <= _M_KEY_MAX:
            smp_dr(Method.GET, 0, 0, 0, (), b"", mkeys)  # raises MadError naming it
        return np.frombuffer(mkeys.to_bytes(8, "big"), np.uint8).reshape(1, 8)
    keys = np.asarray(mkeys)
    if keys.shape != (n,):
        raise ValueError(f"{keys.shape} M_Keys for {n} rows")
    return keys.astype(">u8").view(np.uint8).reshape(n, 8)


class RowCodec:
    """An attribute layout applied to many attributes at once, as rows of a (rows, size) array.

    ``unpack_rows`` decodes them all (a row as the one before it, with only
    the fields that differ read again); ``patch_rows`` writes one field into
    chosen rows; ``patch`` sets a few
    fields of one attribute's bytes as ``Layout.pack(values, base=...)`` would;
    ``fields_at`` and ``get_fields`` read back only the fields some bytes hold
    (cheaper than a whole ``unpack`` when an answer differs from what was sent
    in a byte or two). Bits of no field (reserved) come out zero, as ``pack`` leaves them.
    A value that does not fit, or an unknown name, goes to ``Layout.pack``,
    which raises naming the field.
    """

    __slots__ = ("_at", "_bytes", "_known", "_known_bytes", "_layout", "_size", "_spec")

    def __init__(self, layout: Layout) -> None:
        bits = layout.size * 8
        self._layout = layout
        self._size = layout.size
        self._spec: dict[str, tuple[int, int]] = {}
        known = 0
        for f in layout.fields:
            shift = bits - f.offset - f.width
            known |= ((1 << f.width) - 1) << shift
            if not f.is_bytes:
                self._spec[f.name] = (shift, f.max_value)
        self._known = known
        self._known_bytes = np.frombuffer(known.to_bytes(self._size, "big"), np.uint8)
        # Per integer field within 8 bytes: (first byte, last byte + 1, shift in that word, mask).
        self._bytes: dict[str, tuple[int, int, int, int]] = {}
        for f in layout.fields:
            first, last = f.offset // 8, (f.offset + f.width + 7) // 8
            if not f.is_bytes and last - first <= 8:
                self._bytes[f.name] = (first, last, last * 8 - f.offset - f.width, f.max_value)
        at: list[list[str]] = [[] for _ in range(self._size)]
        for f in layout.fields:
            for j in range(f.offset // 8, (f.offset + f.width + 7) // 8):
                at[j].append(f.name)
        self._at = tuple(tuple(x) for x in at)

    @property
    def size(self) -> int:
        return self._size

    def patch(self, base: bytes, values: Mapping[str, int]) -> bytes:
        """``base`` with ``values`` written over it (reserved bits cleared)."""
        if len(base) != self._size:
            raise SmpError(f"{self._layout.name}: base is {len(base)} bytes, needs {self._size}")
        x = int.from_bytes(base, "big") & self._known
        spec = self._spec
        try:
            for name, v in values.items():
                shift, mask = spec[name]
                if v < 0 or v > mask:
                    raise ValueError(name)
                x = x & ~(mask << shift) | v << shift
        except (KeyError, ValueError, TypeError):
            self._layout.pack(dict(values), base=base)  # raises FieldValueError naming the field
            raise
        return x.to_bytes(self._size, "big")

    def clear_reserved(self, rows: npt.NDArray[np.uint8]) -> None:
        """Zero the bits of no field in every row of a (rows, size) array, as ``pack`` leaves them."""
        rows &= self._known_bytes

    def _words(self, rows: npt.NDArray[np.uint8], first: int, last: int) -> npt.NDArray[np.uint64]:
        """The big-endian word of bytes ``first .. last - 1`` of every row."""
        word = np.zeros(rows.shape[0], np.uint64)
        for j in range(first, last):
            word = word << np.uint64(8) | rows[:, j].astype(np.uint64)
        return word

    def column(self, rows: npt.NDArray[np.uint8], name: str) -> npt.NDArray[np.uint64]:
        """Integer field ``name`` of every row of a (rows, >= size) array."""
        if name not in self._bytes:
            raise SmpError(f"{self._layout.name}.{name}: not an integer field within 8 bytes")
        first, last, shift, mask = self._bytes[name]
        return (self._words(rows, first, last) >> np.uint64(shift)) & np.uint64(mask)

    def unpack_rows(self, rows: npt.NDArray[np.uint8]) -> list[dict[str, FieldValue]]:
        """``Layout.unpack`` of every row of a (rows, >= size) array: equal dicts, same key order.

        Attributes read from many ports of one fabric differ in a few bytes, so
        a row is decoded as a copy of the row before it with only the fields in
        the bytes that differ read again; a row unlike the one before is
        decoded whole.
        """
        n = rows.shape[0]
        if rows.ndim != 2 or rows.shape[1] < self._size:
            raise SmpError(f"{self._layout.name}: rows of {rows.shape[1:]} bytes, need {self._size}")
        rows = rows[:, : self._size]
        out: list[dict[str, FieldValue]] = []
        if not n:
            return out
        blob = np.ascontiguousarray(rows).tobytes()
        size, unpack = self._size, self._layout.unpack
        prev = unpack(blob[:size])
        out.append(prev)
        if n == 1:
            return out
        diff = rows[1:] != rows[:-1]
        # One id per pattern of differing bytes; per pattern, the fields to read again.
        keys = np.packbits(diff, axis=1)
        if keys.shape[1] <= 8:  # one 64-bit word per row: a fast 1-D unique
            word = np.zeros((keys.shape[0], 8), np.uint8)
            word[:, : keys.shape[1]] = keys
            patterns, which = np.unique(word.view(np.uint64).reshape(-1), return_inverse=True)
        else:
            patterns, which = np.unique(keys, axis=0, return_inverse=True)
        plans: list[tuple[tuple[str, int, int], ...] | None] = []
        for k in range(patterns.shape[0]):
            first = int(np.flatnonzero(which.reshape(-1) == k)[0])
            names = {f: None for j in np.flatnonzero(diff[first]).tolist() for f in self._at[j]}
            spec = self._spec
            if len(names) > 12 or any(f not in spec for f in names):
                plans.append(None)  # decoded whole
            else:
                plans.append(tuple((f, *spec[f]) for f in names))
        from_bytes = int.from_bytes
        for i, k in enumerate(which.reshape(-1).tolist(), start=1):
            plan = plans[k]
            if plan is None:
                prev = unpack(blob[i * size : (i + 1) * size])
            else:
                prev = prev.copy()
                if plan:
                    x = from_bytes(blob[i * size : (i + 1) * size], "big")
                    for name, shift, mask in plan:
                        prev[name] = x >> shift & mask
            out.append(prev)
        return out

    def fields_at(self, byte_index: int) -> tuple[str, ...]:
        """Names of the fields with a bit in byte ``byte_index`` of the attribute."""
        return self._at[byte_index]

    def get_fields(self, buf: bytes, names: Sequence[str]) -> dict[str, FieldValue]:
        """Some fields of one attribute, as ``Layout.unpack`` would give them."""
        x = int.from_bytes(buf[: self._size], "big")
        out: dict[str, FieldValue] = {}
        for name in names:
            spec = self._spec.get(name)
            if spec is None:
                out[name] = self._layout.get(buf, name)
            else:
                out[name] = x >> spec[0] & spec[1]
        return out

    def patch_rows(self, rows: npt.NDArray[np.uint8], name: str, which: Sequence[int], values: Sequence[int]) -> None:
        """Write field ``name`` = ``values[k]`` into row ``which[k]`` of a (rows, size) array, in place."""
        if name not in self._bytes:
            raise SmpError(f"{self._layout.name}.{name}: not an integer field within 8 bytes")
        first, last, shift, mask = self._bytes[name]
        if values and (min(values) < 0 or max(values) > mask):
            self._layout.pack({name: next(x for x in values if x < 0 or x > mask)})  # raises, naming the field
        v = np.array(values, np.uint64)
        at = np.asarray(which, np.intp)
        word = self._words(rows[at], first, last)
        field_mask = np.uint64(mask << shift)
        word = word & ~field_mask | (v << np.uint64(shift)) & field_mask
        for j in range(last - 1, first - 1, -1):
            rows[at, j] = (word & np.uint64(0xFF)).astype(np.uint8)
            word = word >> np.uint64(8)

    def get(self, buf: bytes, name: str) -> int:
        """One integer field of the attribute in ``buf``."""
        shift, mask = self._spec[name]
        return int.from_bytes(buf[: self._size], "big") >> shift & mask
