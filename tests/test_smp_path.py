"""The lean SMP path: array-built SMPs, row codecs, the lock-based window engine, program's checks."""

from __future__ import annotations

import asyncio
import queue
import random
import threading
import time

import numpy as np
import pytest

import sm.transport.smp as smp_module
from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from fabric.mad import (
    ATTRIBUTES,
    LFT_BLOCK_SIZE,
    PORT_INFO,
    FieldValueError,
    MadError,
    Method,
    SmpAttr,
    make_response,
    parse_mad,
    smp_dr,
    smp_lid,
)
from fabric.model import PortState
from sm.sweep.manager import FabricManager, SmConfig
from sm.transport.base import MadTimeout, Route, TransportError, WindowedTransport
from sm.transport.emulated import EmulatedTransport
from sm.transport.smp import RowCodec, SmpError, build_smps, smp_batch, smp_batch_dr
from tests.test_emulator import small


def _random_path(rng: random.Random) -> tuple[int, ...]:
    return tuple(rng.randrange(256) for _ in range(rng.randrange(0, 64)))


def test_build_smps_is_byte_for_byte_smp_dr() -> None:
    rng = random.Random(1)
    reqs = [
        (
            _random_path(rng),
            rng.choice([Method.GET, Method.SET]),
            rng.choice(list(SmpAttr)),
            rng.randrange(2**32),
            bytes(rng.randrange(256) for _ in range(rng.choice([0, 5, 64]))),
        )
        for _ in range(300)
    ]
    reqs.append((7, Method.GET, SmpAttr.NODE_INFO, 0, b""))  # LID routed
    for (route, m, a, mod, data), (mad, r) in zip(reqs, build_smps(reqs), strict=True):
        ref = smp_lid(m, a, mod, 0, data) if isinstance(route, int) else smp_dr(m, a, mod, 0, route, data)
        assert mad == ref and r == route


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (((1,) * 64, 1, 0x11, 0, b""), "64 hops"),
        (((256,), 1, 0x11, 0, b""), r"\[256\]"),
        (((1,), 1, 0x11, 2**32, b""), "modifier"),
        (((1,), 1, 0x11, 0, bytes(65)), "65 bytes"),
    ],
)
def test_build_smps_names_what_is_wrong(request_: tuple, message: str) -> None:
    with pytest.raises(MadError, match=message):
        build_smps([request_])


class _Capture(WindowedTransport):
    """Keeps what send_many was given; every request fails."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[bytes, Route]] = []

    def _post(self, mad: bytes, route: Route) -> None:  # pragma: no cover - send_many is replaced
        raise AssertionError

    async def send_many(self, requests, **kw):  # type: ignore[no-untyped-def, override]
        self.requests = list(requests)
        return [TransportError("nothing there")] * len(requests)


async def test_smp_batch_dr_builds_the_same_mads_as_build_smps() -> None:
    rng = random.Random(2)
    paths = [_random_path(rng) for _ in range(40)]
    n = 400
    which = np.array([rng.randrange(40) for _ in range(n)])
    attrs = np.array([rng.choice([0x10, 0x11, 0x15, 0x19]) for _ in range(n)])
    mods = np.array([rng.randrange(2**32) for _ in range(n)], np.int64)
    data = np.frombuffer(rng.randbytes(n * 64), np.uint8).reshape(n, 64)
    t = _Capture()
    res = await smp_batch_dr(t, Method.SET, attrs, paths, which, mods, data)
    rows = enumerate(zip(which.tolist(), attrs.tolist(), mods.tolist(), strict=True))
    ref = build_smps([(paths[w], Method.SET, a, m, data[r].tobytes()) for r, (w, a, m) in rows])
    assert t.requests == ref
    assert not res.ok.any() and sorted(res.errors) == list(range(n))
    assert "nothing there" in str(res.errors[0])
    for bad_path in [(1,) * 64, (256,), (-1,)]:
        with pytest.raises(MadError, match="DR path"):
            await smp_batch_dr(t, Method.GET, 0x11, [bad_path], np.array([0]))
    with pytest.raises(MadError, match="modifier"):
        await smp_batch_dr(t, Method.GET, 0x11, [()], np.array([0]), np.array([2**32]))


async def test_smp_batch_dr_in_chunks_builds_and_answers_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    paths = [_random_path(rng) for _ in range(10)]
    n = 100
    which = np.array([rng.randrange(10) for _ in range(n)])
    mods = np.arange(n, dtype=np.int64)
    data = np.frombuffer(rng.randbytes(n * 64), np.uint8).reshape(n, 64)
    keys = np.arange(1, n + 1, dtype=np.uint64)
    whole, parts = _Capture(), _Capture()
    ref = await smp_batch_dr(whole, Method.SET, 0x19, paths, which, mods, data, mkeys=keys)
    monkeypatch.setattr(smp_module, "SMP_CHUNK", 7)
    sent: list[bytes] = []
    orig = parts.send_many

    async def capture(requests, **kw):  # type: ignore[no-untyped-def]
        out = await orig(requests, **kw)
        sent.extend(r[0] for r in parts.requests)
        return out

    parts.send_many = capture  # type: ignore[method-assign]
    res = await smp_batch_dr(parts, Method.SET, 0x19, paths, which, mods, data, mkeys=keys)
    assert [r[0] for r in whole.requests] == sent  # same MADs, same order
    assert np.array_equal(res.ok, ref.ok) and np.array_equal(res.data, ref.data)
    assert sorted(res.errors) == sorted(ref.errors) == list(range(n))  # rows numbered across chunks


async def test_smp_batch_dr_answers_and_errors_on_the_emulator() -> None:
    emu = EmulatedFabric(small())
    emu.link_down(9, 3)  # LEAF1 port 3
    paths = [emu.dr_path(n) for n in range(emu.fabric.n_nodes)] + [(1, 3, 2)]
    async with EmulatedTransport(emu, timeout=0.01, retries=1) as t:
        res = await smp_batch_dr(t, Method.GET, SmpAttr.NODE_INFO, paths, np.arange(len(paths)))
        old = await smp_batch(t, [(p, Method.GET, SmpAttr.NODE_INFO, 0, b"") for p in paths])
    assert res.ok[:-1].all() and not res.ok[-1]
    assert isinstance(res.errors[len(paths) - 1], MadTimeout) and "DR path [1, 3, 2]" in str(res.errors[len(paths) - 1])
    for r, ans in enumerate(old[:-1]):
        assert res.data[r].tobytes() == ans  # what the one-by-one path returns
    assert not res.data[-1].any()


async def test_smp_batch_checks_status_attribute_and_names_them() -> None:
    class Odd(EmulatedTransport):
        def _deliver(self, mad: bytes) -> None:
            m = parse_mad(mad)
            if m.attr_id == SmpAttr.SWITCH_INFO:  # a device that answers with an error status
                mad = make_response(mad, m.data, status=0x1C)
            elif m.attr_id == SmpAttr.NODE_DESC:  # ... or for another attribute
                buf = bytearray(mad)
                buf[16:18] = b"\x00\x11"
                mad = bytes(buf)
            super()._deliver(mad)

    emu = EmulatedFabric(small())
    path = emu.dr_path(9)
    async with Odd(emu) as t:
        reqs = [(path, Method.GET, a, 0, b"") for a in (SmpAttr.NODE_INFO, SmpAttr.SWITCH_INFO, SmpAttr.NODE_DESC)]
        ni, si, nd = await smp_batch(t, reqs)
        res = await smp_batch_dr(t, Method.GET, np.array([r[2] for r in reqs]), [path], np.zeros(3, np.intp))
    assert isinstance(ni, bytes)
    assert isinstance(si, SmpError) and "status 0x001c" in str(si) and "0x0012" in str(si)
    assert isinstance(nd, SmpError) and "for attribute 0x0011" in str(nd)
    assert res.ok.tolist() == [True, False, False]
    assert str(res.errors[1]) == str(si) and str(res.errors[2]) == str(nd)


def _similar_rows(rng: random.Random, size: int, n: int) -> list[bytes]:
    base = rng.randbytes(size)
    rows: list[bytes] = []
    for _ in range(n):
        b = bytearray(rows[-1] if rows and rng.random() < 0.8 else base)
        for _ in range(rng.choice([0, 0, 1, 2, 3, 30])):
            b[rng.randrange(size)] = rng.randrange(256)
        rows.append(bytes(b))
    return rows


@pytest.mark.parametrize("key", sorted(ATTRIBUTES), ids=lambda k: ATTRIBUTES[k].name)
def test_row_codec_unpacks_like_the_layout(key: tuple[int, int]) -> None:
    layout = ATTRIBUTES[key]
    codec = RowCodec(layout)
    rng = random.Random(key[1])
    for n in (0, 1, 2, 200):
        rows = _similar_rows(rng, layout.size, n)
        arr = np.frombuffer(b"".join(rows), np.uint8).reshape(n, layout.size)
        wide = np.zeros((n, layout.size + 8), np.uint8)  # an SMP's data area is wider than most attributes
        wide[:, : layout.size] = arr
        for got in (codec.unpack_rows(arr), codec.unpack_rows(wide)):
            assert len(got) == n and len({id(d) for d in got}) == n
            for raw, d in zip(rows, got, strict=True):
                ref = layout.unpack(raw)
                assert d == ref and list(d) == list(ref)


@pytest.mark.parametrize("key", sorted(ATTRIBUTES), ids=lambda k: ATTRIBUTES[k].name)
def test_row_codec_columns_are_the_layouts_fields(key: tuple[int, int]) -> None:
    layout = ATTRIBUTES[key]
    codec = RowCodec(layout)
    rng = random.Random(key[1] + 7)
    rows = _similar_rows(rng, layout.size, 50)
    arr = np.frombuffer(b"".join(rows), np.uint8).reshape(50, layout.size)
    refs = [layout.unpack(raw) for raw in rows]
    columns = 0
    for f in layout.fields:
        if f.is_bytes or (f.offset + f.width + 7) // 8 - f.offset // 8 > 8:
            with pytest.raises(SmpError, match=f.name):
                codec.column(arr, f.name)
            continue
        assert codec.column(arr, f.name).tolist() == [d[f.name] for d in refs], f.name
        columns += 1
    assert columns or all(f.is_bytes or f.width > 64 for f in layout.fields)


def test_row_codec_patches_like_pack() -> None:
    codec = RowCodec(PORT_INFO)
    rng = random.Random(4)
    fields = {f.name: f.width for f in PORT_INFO.fields}
    rows = [rng.randbytes(64) for _ in range(200)]
    wants = [{k: rng.randrange(1 << w) for k, w in fields.items() if rng.random() < 0.3} for _ in rows]
    arr = np.frombuffer(b"".join(rows), np.uint8).reshape(-1, 64).copy()
    codec.clear_reserved(arr)
    for name in fields:
        which = [r for r, w in enumerate(wants) if name in w]
        codec.patch_rows(arr, name, which, [wants[r][name] for r in which])
    for r, (raw, want) in enumerate(zip(rows, wants, strict=True)):
        ref = PORT_INFO.pack(PORT_INFO.unpack(raw) | want)
        assert codec.patch(raw, want) == ref == arr[r].tobytes()
        assert codec.get_fields(ref, list(want)) == want
    with pytest.raises(FieldValueError, match="LMC"):
        codec.patch(rows[0], {"LMC": 8})
    with pytest.raises(FieldValueError, match="LMC"):
        codec.patch_rows(arr, "LMC", [0], [-1])
    with pytest.raises(FieldValueError, match="Foo"):
        codec.patch(rows[0], {"Foo": 1})


class _Threaded(WindowedTransport):
    """Answers come from a thread of their own, which also runs the deadlines (like UmadTransport)."""

    _THREADED = True

    def __init__(self, *, drop: float = 0.0, tick: float = 0.002, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.tick = tick
        self.wire: queue.Queue[bytes | None] = queue.Queue()
        self.rng = random.Random(9)
        self.drop = drop
        self.most = 0
        self.thread = threading.Thread(target=self._answer, daemon=True)
        self.thread.start()

    def _post(self, mad: bytes, route: Route) -> None:
        self.most = max(self.most, len(self._pending))
        self.wire.put(mad)

    def _answer(self) -> None:
        while True:
            try:
                mad = self.wire.get(timeout=self.tick)
            except queue.Empty:
                mad = b""
            if mad is None:
                return
            if mad and self.rng.random() >= self.drop:
                self._deliver(make_response(mad, b"\x01" * 8))
            self._expire_due(time.monotonic())

    async def _close(self) -> None:
        self.wire.put(None)
        self.thread.join(2)


async def test_threaded_engine_fills_the_window_and_answers_everything() -> None:
    t = _Threaded(window=8)
    mads = [(smp_dr(Method.GET, SmpAttr.NODE_INFO, 0, 0, (i % 7,)), (i % 7,)) for i in range(300)]
    out = await asyncio.gather(t.send_many(mads[:150]), *(t.send(m, r) for m, r in mads[150:]))
    assert t.most == 8  # a gather of sends is posted together: the window fills, never more
    answers = out[0] + list(out[1:])
    assert all(isinstance(a, bytes) and parse_mad(a).initial_path == r for a, (_, r) in zip(answers, mads, strict=True))
    assert t.stats.sent == t.stats.received == 300 and not t._pending
    await t.close()
    assert not t.thread.is_alive()


async def test_threaded_engine_retries_and_times_out_never_early() -> None:
    t = _Threaded(window=4, timeout=0.02, retries=6, drop=0.3)
    mads = [(smp_dr(Method.GET, SmpAttr.NODE_INFO, 0, 0, (1,)), (1,))] * 60
    out = await t.send_many(mads)
    assert all(isinstance(a, bytes) for a in out) and t.stats.retries > 0
    t.drop = 1.0
    t0 = time.monotonic()
    (res,) = await t.send_many(mads[:1], retries=2)
    assert isinstance(res, MadTimeout) and "3 attempt(s)" in str(res)
    assert time.monotonic() - t0 >= 3 * 0.02
    await t.close()


async def test_a_cancelled_batch_frees_its_slots() -> None:
    t = _Threaded(window=4, timeout=5.0, drop=1.0)  # nothing is answered
    mads = [(smp_dr(Method.GET, SmpAttr.NODE_INFO, 0, 0, (1,)), (1,))] * 20
    task = asyncio.ensure_future(t.send_many(mads))
    await asyncio.sleep(0.02)
    assert len(t._pending) == 4
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not t._pending and not t._ready
    t.drop = 0.0
    assert isinstance(await t.send(*mads[0]), bytes)
    await t.close()
    with pytest.raises(TransportError):
        await t.send(*mads[0])


class _Meddling(EmulatedTransport):
    """Alters answers: LFT blocks of one switch read back changed or never answer; PortInfo Sets not taken."""

    def __init__(self, emu: EmulatedFabric, *, changed: tuple[int, ...], lost: tuple[int, ...], **kw: object) -> None:
        super().__init__(emu, **kw)  # type: ignore[arg-type]
        self.changed, self.lost = changed, lost
        self.ignore_active: tuple[int, ...] = ()
        self.refuse_mtu: tuple[int, ...] = ()
        self.on = True

    def _post(self, mad: bytes, route: Route) -> None:
        m = parse_mad(mad)
        if self.on and m.method == Method.SET and m.attr_id == SmpAttr.LFT and route in self.lost:
            return  # never answered
        super()._post(mad, route)

    def _deliver(self, mad: bytes) -> None:
        m = parse_mad(mad)
        if self.on and m.attr_id == SmpAttr.LFT and m.initial_path in self.changed:
            data = bytearray(m.data)
            data[5] ^= 1
            mad = make_response(mad, bytes(data))
        if self.on and m.attr_id == SmpAttr.PORT_INFO and m.initial_path in self.ignore_active:
            pi = PORT_INFO.unpack(m.data)
            if pi["PortState"] == PortState.ACTIVE:
                mad = make_response(mad, PORT_INFO.pack(pi | {"PortState": int(PortState.ARMED)}))
        refuse = self.on and m.initial_path in self.refuse_mtu
        if refuse and m.attr_id == SmpAttr.PORT_INFO and m.method == Method.GET_RESP:
            pi = PORT_INFO.unpack(m.data)
            mad = make_response(mad, PORT_INFO.pack(pi | {"NeighborMTU": 1}))
        super()._deliver(mad)


async def test_program_names_failed_blocks_and_sends_them_again() -> None:
    f = fattree(2, 4)
    emu = EmulatedFabric(f)
    sw = f.switches.tolist()
    changed, lost = emu.dr_path(sw[0]), emu.dr_path(sw[1])
    t = _Meddling(emu, changed=(changed,), lost=(lost,), window=32, timeout=0.01, retries=1)
    t.ignore_active = (emu.dr_path(sw[2]),)
    mgr = FabricManager(t, SmConfig())
    snap = await mgr.heavy_sweep()
    fails = snap.program.failures
    name0, name1, name2 = (snap.fabric.names[snap.fabric.by_guid(int(f.node_guid[s]))] for s in sw[:3])
    assert any(x.startswith(f"{name0}: LFT block 0 (LIDs 0..{LFT_BLOCK_SIZE - 1}) reads back different") for x in fails)
    assert any(x.startswith(f"{name1}: LFT block 0") and "Set failed: MAD timeout" in x for x in fails)
    assert any(x == f"{name2}[1]: PortInfo Set ACTIVE not taken: {{'PortState': (4, 3)}}" for x in fails)
    assert not snap.up
    row0 = snap.fabric.switches.tolist().index(snap.fabric.by_guid(int(f.node_guid[sw[0]])))
    assert mgr.held[int(f.node_guid[sw[0]])][5] == snap.lft[row0, 5] ^ 1  # what the switch said it holds
    # Fixed: the next sweep sends exactly the blocks that failed.
    t.on = False
    again = await mgr.heavy_sweep()
    assert not again.program.failures and again.up
    assert again.program.blocks_sent == 2


async def test_a_portinfo_field_the_answer_does_not_show_is_named() -> None:
    f = fattree(2, 4)
    emu = EmulatedFabric(f)
    sw = f.switches.tolist()
    t = _Meddling(emu, changed=(), lost=())
    t.refuse_mtu = (emu.dr_path(sw[1]),)
    snap = await FabricManager(t, SmConfig()).heavy_sweep()
    name = snap.fabric.names[snap.fabric.by_guid(int(f.node_guid[sw[1]]))]
    bad = [x for x in snap.program.failures if x.startswith(f"{name}[") and "PortInfo Set config not taken" in x]
    # Every linked port of that switch: the MTU it was sent (5: 4096) is not what it answers (1).
    assert len(bad) == int(f.up_mask()[sw[1], 1:].sum())
    assert all("'NeighborMTU': (5, 1)" in x and "LID" not in x for x in bad)
    assert not snap.up


def test_a_transport_outlives_its_event_loop() -> None:
    """One transport, several ``asyncio.run``: deadlines and flushes follow the loop in use."""
    emu = EmulatedFabric(small())
    emu.link_down(9, 3)
    t = EmulatedTransport(emu, timeout=0.01, retries=1)
    good = (emu.dr_path(9), smp_dr(Method.GET, SmpAttr.NODE_INFO, 0, 0, emu.dr_path(9)))
    lost = ((1, 3, 2), smp_dr(Method.GET, SmpAttr.NODE_INFO, 0, 0, (1, 3, 2)))
    for _ in range(3):
        out = asyncio.run(asyncio.wait_for(t.send_many([(good[1], good[0]), (lost[1], lost[0])]), 5))
        assert isinstance(out[0], bytes) and isinstance(out[1], MadTimeout)

    th = _Threaded(window=4, timeout=5.0, tick=2.0)  # deadlines seldom looked at: no fill from there
    loop = asyncio.new_event_loop()

    async def cut_short() -> asyncio.Future[bytes]:
        return asyncio.ensure_future(th.send(*good[::-1]))  # the batch goes in as the loop stops

    task = loop.run_until_complete(cut_short())
    assert th._flush_loop is loop and th._ready  # its flush is due on this loop ...
    task._log_destroy_pending = False  # type: ignore[attr-defined]  # it is meant to die with its loop
    loop.close()  # ... which ends before the flush runs
    t0 = time.monotonic()
    assert isinstance(asyncio.run(asyncio.wait_for(th.send(*good[::-1]), 5)), bytes)
    assert time.monotonic() - t0 < 1.0  # posted at once, on the loop in use
    asyncio.run(th.close())
