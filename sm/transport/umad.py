"""The real transport: MADs through libibumad (``/dev/infiniband/umadN``) via ctypes.

One port, three agents on it: SubnMgt directed route (class 0x81) and LID
routed (0x01) on QP0, PerfMgt (0x04, version 1) on QP1; the LID-routed agent
also takes unsolicited Trap MADs (trap 128 and friends arrive as
LID-routed SubnTrap). An SM (``issm=True``) also takes SubnGet and SubnSet
on both SMP agents (SMInfo from peer SMs), and with ``serve_sa=True`` a
fourth agent holds Subnet Administration (class 0x03, version 2, RMPP
version 1: the kernel cuts long answers into segments; libumad2sim, which
has no RMPP, sends only the first MAD of one). Sends go out with kernel timeout 0 and no kernel
retries: :class:`~sm.transport.base.WindowedTransport` owns the window,
timeouts, retries and TID matching. A receive thread sits in
``umad_recv`` with a short timeout (so it can stop); it matches each answer
to its request and posts the next request of the window itself, so a batch
of SMPs runs without the event loop waking per MAD (it hears of a finished
batch, and of traps). ``issm=True`` holds the
port's ``issmN`` device open, which raises PortInfo.CapabilityMask.IsSM as
a master SM does (ibsim delivers traps only to such a client).

What arrives is trusted no further than its length: answers go to the
window engine (which matches TIDs and checks nothing else), SubnTrap
notices to the trap queue, requests to the SM's services when one is
served (on the event loop), and every other request is refused with an
error status from the receive thread (``refusal``), as the kernel's MAD
layer refuses a request no agent takes.

Under ibsim the same code runs with ``LD_PRELOAD=libumad2sim.so`` set when
the process starts; libumad2sim fakes the device and sysfs underneath
libibumad. One thing here knows about it: libumad2sim hands a MAD of a class
no agent registered to the umad descriptor in its last slot, and crashes
the process (a NULL dereference in its receive thread) when that slot is
not open; any host's ``saquery`` to our LID would do it. Under libumad2sim
the transport therefore opens every slot and reads the last one as a sink
(``_open_sink``): such MADs are refused like any other request.

Only libibumad.so.3 (Debian/Ubuntu ``libibumad3``, rdma-core) is needed at
run time; the structure layouts below mirror rdma-core's ``umad.h``.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import logging
import os
import struct
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sm.transport.base import (
    _TID,
    MAD_HEADER_SIZE,
    MAX_BACKLOG,
    TID_OFFSET,
    MadAddress,
    Route,
    TransportError,
    WindowedTransport,
    is_trap,
    refusal,
)

log = logging.getLogger(__name__)

MAD_SIZE = 256
PERMISSIVE_LID = 0xFFFF
GSI_QKEY = 0x80010000

MGMT_CLASS_SUBN_LID = 0x01
MGMT_CLASS_SA = 0x03
MGMT_CLASS_PERF = 0x04
MGMT_CLASS_SUBN_DR = 0x81

METHOD_GET = 0x01
METHOD_SET = 0x02
METHOD_TRAP = 0x05
SA_CLASS_VERSION = 2
SA_REQUEST_METHODS = (0x01, 0x02, 0x12, 0x13, 0x14, 0x15)
"""Get, Set, GetTable, GetTraceTable, GetMulti, Delete: the requests an SA takes."""
MAX_RMPP_BYTES = 256 * 1024
"""Longest answer handed to the kernel's RMPP in one send."""

PORT_STATE_NAMES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE"}
PORT_ACTIVE = 4
PORT_INIT = 2

_RECV_POLL_S = 0.05
_DR_ADDR = (PERMISSIVE_LID, 0, 0)
"""(DLID, QP, Q_Key) of every directed-route SMP."""
_CA_NAME_LEN = 20
_MAX_CAS = 32
_CA_MAX_PORTS = 10
_UMAD2SIM_FD_SLOTS = 8
"""libumad2sim's umad descriptors per device (its FD_PER_DEVICE)."""
_SINK_SLICE_S = 0.005
"""Longest the receive thread spends at once on MADs of classes no agent of ours registered."""
_REFUSALS_PER_S = 2000

"""Most requests answered with an error status per second; a flood beyond is counted only."""
_MAX_SOURCES = 4096
"""Most source addresses the receive thread keeps a :class:`MadAddress` of (then it starts afresh)."""


# -- rdma-core umad.h layouts (ABI of libibumad.so.3) -------------------------


class _MadAddr(ctypes.Structure):
    """``struct ib_mad_addr`` (44 bytes, 4-byte aligned)."""

    _fields_ = [
        ("qpn", ctypes.c_uint32),  # network order
        ("qkey", ctypes.c_uint32),  # network order
        ("lid", ctypes.c_uint16),  # network order
        ("sl", ctypes.c_uint8),
        ("path_bits", ctypes.c_uint8),
        ("grh_present", ctypes.c_uint8),
        ("gid_index", ctypes.c_uint8),
        ("hop_limit", ctypes.c_uint8),
        ("traffic_class", ctypes.c_uint8),
        ("gid", ctypes.c_uint8 * 16),
        ("flow_label", ctypes.c_uint32),
        ("pkey_index", ctypes.c_uint16),
        ("reserved", ctypes.c_uint8 * 6),
    ]


_ADDR_OFFSET = 20
"""Offset of ``addr`` in ``struct ib_user_mad`` (agent_id, status, timeout_ms, retries, length before it)."""
_ADDR_HEAD = struct.Struct(">IIHB")
"""The head of ``struct ib_mad_addr`` in a umad buffer: QPN, Q_Key, LID (network order) and SL."""
_PKEY_INDEX = _ADDR_OFFSET + _MadAddr.pkey_index.offset
_QKEY = _ADDR_OFFSET + _MadAddr.qkey.offset
_LID = _ADDR_OFFSET + _MadAddr.lid.offset
_NO_QKEY = bytes(4)
_GSI_QKEY = GSI_QKEY.to_bytes(4, "big")
_BURST = 16
"""Most MADs the receive thread takes in a row without blocking before it sends the answers it holds
and checks its deadlines."""


class _UmadPort(ctypes.Structure):
    """``umad_port_t`` (112 bytes on LP64)."""

    _fields_ = [
        ("ca_name", ctypes.c_char * _CA_NAME_LEN),
        ("portnum", ctypes.c_int),
        ("base_lid", ctypes.c_uint),
        ("lmc", ctypes.c_uint),
        ("sm_lid", ctypes.c_uint),
        ("sm_sl", ctypes.c_uint),
        ("state", ctypes.c_uint),
        ("phys_state", ctypes.c_uint),
        ("rate", ctypes.c_uint),
        ("capmask", ctypes.c_uint32),  # network order
        ("gid_prefix", ctypes.c_uint64),  # network order
        ("port_guid", ctypes.c_uint64),  # network order
        ("pkeys_size", ctypes.c_uint),
        ("pkeys", ctypes.POINTER(ctypes.c_uint16)),
        ("link_layer", ctypes.c_char * _CA_NAME_LEN),
    ]


class _UmadCa(ctypes.Structure):
    """``umad_ca_t`` (208 bytes on LP64)."""

    _fields_ = [
        ("ca_name", ctypes.c_char * _CA_NAME_LEN),
        ("node_type", ctypes.c_uint),
        ("numports", ctypes.c_int),
        ("fw_ver", ctypes.c_char * 20),
        ("ca_type", ctypes.c_char * 40),
        ("hw_ver", ctypes.c_char * 20),
        ("node_guid", ctypes.c_uint64),  # network order
        ("system_guid", ctypes.c_uint64),  # network order
        ("ports", ctypes.POINTER(_UmadPort) * _CA_MAX_PORTS),
    ]


_USER_MAD_HDR = 20 + ctypes.sizeof(_MadAddr)  # struct ib_user_mad before data[]
assert ctypes.sizeof(_MadAddr) == 44 and _USER_MAD_HDR == 64
assert ctypes.sizeof(_UmadPort) == 112 and ctypes.sizeof(_UmadCa) == 208


class _MethodMask(ctypes.Array[ctypes.c_long]):
    """The 128-bit method mask umad_register takes, as an array of C longs."""

    _type_ = ctypes.c_long
    _length_ = 16 // ctypes.sizeof(ctypes.c_long)


def _be64(value: int) -> int:
    """A network-order 64-bit field as read through ctypes, in host order."""
    return int.from_bytes(value.to_bytes(8, sys.byteorder), "big")


def _be32(value: int) -> int:
    return int.from_bytes(value.to_bytes(4, sys.byteorder), "big")


def _be16(value: int) -> int:
    return int.from_bytes(value.to_bytes(2, sys.byteorder), "big")


def _method_mask(*methods: int) -> _MethodMask:
    """A 128-bit method mask as libibumad wants it (bit n of long n//64)."""
    mask = _MethodMask()
    bits = ctypes.sizeof(ctypes.c_long) * 8
    for m in methods:
        mask[m // bits] |= 1 << (m % bits)
    return mask


def _bare(lib: ctypes.CDLL, name: str, *, keep_gil: bool = False) -> Any:
    """``lib.name`` without argtypes, for the per-MAD calls: a third of the call cost.

    Only for functions whose arguments are all C ints and pointers passed as
    ctypes objects (buffers, ``byref``), and that return int. ``keep_gil``: the
    call does not release the GIL (a ``PyDLL`` function), for calls that never
    wait (a receive without a timeout on the non-blocking descriptor, a send):
    releasing and taking the GIL back costs as much as the call itself.
    """
    fn = (ctypes.PyDLL(lib._name, handle=lib._handle) if keep_gil else lib)._FuncPtr((name, lib))
    fn.restype = ctypes.c_int
    return fn


def _set_addr(view: memoryview, addr: tuple[int, int, int]) -> None:
    """``umad_set_addr(buffer, DLID, QP, SL 0, Q_Key)`` for (DLID, QP, Q_Key) ``addr``, without a call
    into C: the same stores into ``struct ib_mad_addr`` (QPN, Q_Key and LID in network order, SL)."""
    _ADDR_HEAD.pack_into(view, _ADDR_OFFSET, addr[1], addr[2], addr[0], 0)


def _under_umad2sim() -> bool:
    """libumad2sim (ibsim's stand-in for the kernel's umad devices) is preloaded in this process."""
    return "umad2sim" in os.environ.get("LD_PRELOAD", "")


def _err(rc: int) -> str:
    code = -rc if rc < 0 else rc
    return f"{errno.errorcode.get(code, str(code))} ({os.strerror(code)})"


# -- the library --------------------------------------------------------------

_lib_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


LIBIBUMAD_NAMES = ("libibumad.so.3",)


def load_libibumad(names: Sequence[str] | None = None) -> ctypes.CDLL:
    """Load libibumad.so.3 once and declare the prototypes we call.

    ``names`` overrides the library names tried (and bypasses the cache).
    """
    global _lib
    with _lib_lock:
        if _lib is not None and names is None:
            return _lib
        candidates = list(LIBIBUMAD_NAMES if names is None else names)
        if names is None:
            found = ctypes.util.find_library("ibumad")
            if found and found not in candidates:
                candidates.append(found)
        lib = None
        errors = []
        for name in candidates:
            try:
                lib = ctypes.CDLL(name, use_errno=True)
                break
            except OSError as exc:
                errors.append(str(exc))
        if lib is None:
            raise TransportError("libibumad not found (install libibumad3 from rdma-core): " + "; ".join(errors))
        c_int, c_char_p, c_void_p = ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p
        protos: dict[str, tuple[object, list[object]]] = {
            "umad_init": (c_int, []),
            "umad_done": (c_int, []),
            "umad_get_cas_names": (c_int, [c_void_p, c_int]),
            "umad_get_ca": (c_int, [c_char_p, ctypes.POINTER(_UmadCa)]),
            "umad_release_ca": (c_int, [ctypes.POINTER(_UmadCa)]),
            "umad_get_port": (c_int, [c_char_p, c_int, ctypes.POINTER(_UmadPort)]),
            "umad_release_port": (c_int, [ctypes.POINTER(_UmadPort)]),
            "umad_get_issm_path": (c_int, [c_char_p, c_int, c_char_p, c_int]),
            "umad_open_port": (c_int, [c_char_p, c_int]),
            "umad_close_port": (c_int, [c_int]),
            "umad_size": (ctypes.c_size_t, []),
            "umad_get_mad": (c_void_p, [c_void_p]),
            "umad_status": (c_int, [c_void_p]),
            "umad_get_mad_addr": (ctypes.POINTER(_MadAddr), [c_void_p]),
            "umad_set_addr": (c_int, [c_void_p, c_int, c_int, c_int, c_int]),
            "umad_set_pkey": (c_int, [c_void_p, c_int]),
            "umad_send": (c_int, [c_int, c_int, c_void_p, c_int, c_int, c_int]),
            "umad_recv": (c_int, [c_int, c_void_p, ctypes.POINTER(c_int), c_int]),
            "umad_register": (c_int, [c_int, c_int, c_int, ctypes.c_uint8, ctypes.POINTER(_MethodMask)]),
            "umad_unregister": (c_int, [c_int, c_int]),
        }
        for fname, (restype, argtypes) in protos.items():
            try:
                fn = getattr(lib, fname)
            except AttributeError as exc:
                raise TransportError(f"libibumad lacks {fname}: too old a libibumad") from exc
            fn.restype = restype
            fn.argtypes = argtypes
        if names is None:
            _lib = lib
        return lib


# -- what we tell callers ------------------------------------------------------


@dataclass(frozen=True)
class PortAttrs:
    """What sysfs says about a local port (via umad_get_port)."""

    ca_name: str
    port_num: int
    state: int
    phys_state: int
    base_lid: int
    lmc: int
    sm_lid: int
    sm_sl: int
    capmask: int
    gid_prefix: int
    port_guid: int
    link_layer: str

    @property
    def state_name(self) -> str:
        return PORT_STATE_NAMES.get(self.state, str(self.state))


def _port_attrs(p: _UmadPort) -> PortAttrs:
    return PortAttrs(
        ca_name=p.ca_name.decode(errors="replace"),
        port_num=p.portnum,
        state=p.state,
        phys_state=p.phys_state,
        base_lid=p.base_lid,
        lmc=p.lmc,
        sm_lid=p.sm_lid,
        sm_sl=p.sm_sl,
        capmask=_be32(p.capmask),
        gid_prefix=_be64(p.gid_prefix),
        port_guid=_be64(p.port_guid),
        link_layer=p.link_layer.decode(errors="replace"),
    )


def list_ports(lib: ctypes.CDLL | None = None) -> list[PortAttrs]:
    """Every local IB port of every CA, in libibumad's CA order then port order."""
    lib = lib or load_libibumad()
    names_buf = (ctypes.c_char * (_CA_NAME_LEN * _MAX_CAS))()
    n = lib.umad_get_cas_names(names_buf, _MAX_CAS)
    if n < 0:
        raise TransportError(f"umad_get_cas_names failed: {_err(n)}")
    out: list[PortAttrs] = []
    for i in range(n):
        raw = names_buf.raw[i * _CA_NAME_LEN : (i + 1) * _CA_NAME_LEN]
        name = raw.split(b"\0", 1)[0]
        ca = _UmadCa()
        rc = lib.umad_get_ca(name, ctypes.byref(ca))
        if rc < 0:
            # libibumad names a default CA (mthca0) when there is none at all
            log.debug("umad_get_ca(%s) failed: %s", name.decode(), _err(rc))
            continue
        try:
            for slot in range(_CA_MAX_PORTS):
                ptr = ca.ports[slot]
                if ptr:
                    out.append(_port_attrs(ptr.contents))
        finally:
            lib.umad_release_ca(ctypes.byref(ca))
    return out


def choose_port(ports: list[PortAttrs], ca: str | None, port: int | None) -> PortAttrs:
    """The port to use: as named, else the first ACTIVE one, else the first with its link up.

    Ports of an unconfigured fabric sit in INIT (LinkUp) until an SM brings
    them up, so INIT and ARMED ports are acceptable when none is ACTIVE.
    """
    if not ports:
        raise TransportError("no InfiniBand device found (no CA in /sys/class/infiniband)")
    cands = [p for p in ports if ca is None or p.ca_name == ca]
    if not cands:
        names = sorted({p.ca_name for p in ports})
        raise TransportError(f"CA {ca!r} not found; CAs present: {', '.join(names)}")
    if port is not None:
        cands = [p for p in cands if p.port_num == port]
        if not cands:
            raise TransportError(f"port {port} not found on CA {ca or ports[0].ca_name}")
        return cands[0]
    ib = [p for p in cands if p.link_layer in ("", "InfiniBand", "IB")] or cands
    for p in ib:
        if p.state == PORT_ACTIVE:
            return p
    for p in ib:
        if p.state >= PORT_INIT:
            return p
    seen = ", ".join(f"{p.ca_name}/{p.port_num} {p.state_name}" for p in cands)
    raise TransportError(f"no port with its link up: {seen}")


# -- the transport -------------------------------------------------------------


class UmadTransport(WindowedTransport):
    """MADs over a local HCA or switch port through libibumad.

    ``await UmadTransport.open(ca, port)`` or ``UmadTransport(...)`` then
    ``start()`` from inside the event loop. Without ``ca``/``port`` it takes
    the first ACTIVE port, else the first with its link up (INIT before an
    SM runs). With ``issm=True`` the port's IsSM capability bit is raised.
    """

    _THREADED = True
    _PEEKS_ON_ARRIVAL = True
    kernel_rmpp = True
    max_answer_bytes = 256 * 1024

    def __init__(
        self,
        ca: str | None = None,
        port: int | None = None,
        *,
        window: int = 16,
        timeout: float = 0.2,
        retries: int = 3,
        issm: bool = False,
        serve_sa: bool = False,
    ) -> None:
        super().__init__(window=window, timeout=timeout, retries=retries)
        self._want_ca = ca
        self._want_port = port
        self._want_issm = issm
        self._want_sa = serve_sa
        self._lib: ctypes.CDLL | None = None
        self._inited = False
        self._portid = -1
        self._issm_fd = -1
        self._libc: ctypes.CDLL | None = None
        self._agents: dict[int, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._send_buf: ctypes.Array[ctypes.c_char] | None = None
        self._long_buf: ctypes.Array[ctypes.c_char] | None = None
        self._long_view: memoryview | None = None
        self._long_addr: tuple[int, int, int] | None = None
        """The buffer answers of other lengths than a MAD go out from (reused; with the engine lock held)."""
        self._send_view: memoryview | None = None
        self._send_addr: tuple[int, int, int] | None = None
        self._hdr_size = _USER_MAD_HDR
        self._umad_send: Any = None
        self._trap_sources: OrderedDict[bytes, MadAddress] = OrderedDict()
        self._sources: dict[bytes, MadAddress] = {}
        """struct ib_mad_addr's bytes -> its MadAddress (the receive thread's)."""
        self._spare_ports: list[int] = []
        self._sink = -1
        self._refusal_tokens = float(_REFUSALS_PER_S)
        self._refusal_t = time.monotonic()
        self.rx_errors = 0
        self.attrs: PortAttrs | None = None

    # -- lifetime ---------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        ca: str | None = None,
        port: int | None = None,
        *,
        window: int = 16,
        timeout: float = 0.2,
        retries: int = 3,
        issm: bool = False,
        serve_sa: bool = False,
    ) -> UmadTransport:
        """Open the port, register the agents and start receiving."""
        t = cls(ca, port, window=window, timeout=timeout, retries=retries, issm=issm, serve_sa=serve_sa)
        t.start()
        return t

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Open the device and start the receive thread; replies go to ``loop`` (default: the running one)."""
        if self._thread is not None:
            raise TransportError("transport already started")
        if self._closed:
            raise TransportError("transport is closed")
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise TransportError("UmadTransport.start() needs a running event loop or loop=") from None
        self._loop = loop
        try:
            self._open_device()
        except BaseException:
            self._release_device()
            raise
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._rx_loop, name=f"umad-rx-{self.ca_name}/{self.port_num}", daemon=True
        )
        self._thread.start()

    def _open_device(self) -> None:
        lib = self._lib = load_libibumad()
        rc = lib.umad_init()
        if rc < 0:
            raise TransportError(f"umad_init failed: {_err(rc)} (is ib_umad loaded?)")
        self._inited = True
        attrs = choose_port(list_ports(lib), self._want_ca, self._want_port)
        self.attrs = attrs
        where = f"{attrs.ca_name} port {attrs.port_num}"
        portid = lib.umad_open_port(attrs.ca_name.encode(), attrs.port_num)
        if portid < 0:
            hint = ""
            if -portid == errno.EACCES:
                hint = " (run as root or grant access to /dev/infiniband/umad*)"
            raise TransportError(f"umad_open_port {where} failed: {_err(portid)}{hint}")
        self._portid = portid
        # One agent per class, as OpenSM binds them. Responses come back to the agent
        # by TID; the LID-routed SMP agent also takes unsolicited SubnTrap (trap 128 ...).
        # An SM also answers SubnGet/SubnSet(SMInfo) from its peers on both SMP agents.
        sm_methods = (METHOD_GET, METHOD_SET) if self._want_issm else ()
        for mclass, version, mask, rmpp in (
            (MGMT_CLASS_SUBN_DR, 1, _method_mask(*sm_methods) if sm_methods else None, 0),
            (MGMT_CLASS_SUBN_LID, 1, _method_mask(METHOD_TRAP, *sm_methods), 0),
            (MGMT_CLASS_PERF, 1, None, 0),
            *([(MGMT_CLASS_SA, SA_CLASS_VERSION, _method_mask(*SA_REQUEST_METHODS), 1)] if self._want_sa else []),
        ):
            self._agents[mclass] = self._register(mclass, version, mask, where, rmpp)
        if _under_umad2sim():
            self._open_sink(attrs)
        # issm last: holding it makes us the SM that traps go to, and a trap arriving before
        # the agents exist crashed libumad2sim's receive thread (seen 10 times in 30 reconnects).
        if self._want_issm:
            self._open_issm(attrs)
        self._hdr_size = lib.umad_size()
        self._send_buf = ctypes.create_string_buffer(self._hdr_size + MAD_SIZE)
        self._send_view = memoryview(self._send_buf).cast("B")
        self._send_addr = None
        self._umad_send = _bare(lib, "umad_send", keep_gil=True)

    def _open_sink(self, attrs: PortAttrs) -> None:
        """Under libumad2sim: open its remaining descriptor slots; the last takes unregistered classes.

        libumad2sim looks up the descriptor of an arriving request's class
        (``agent_fds[class]``, -1 when no agent has it), which maps to its
        last slot; with that slot empty it dereferences NULL.
        """
        assert self._lib is not None
        for _ in range(_UMAD2SIM_FD_SLOTS - 1):
            portid = self._lib.umad_open_port(attrs.ca_name.encode(), attrs.port_num)
            if portid < 0:
                break  # every slot taken already (another transport in this process holds them)
            self._spare_ports.append(portid)
        if len(self._spare_ports) == _UMAD2SIM_FD_SLOTS - 1:
            self._sink = self._spare_ports[-1]
        else:
            log.warning(
                "libumad2sim: %d of %d descriptor slots free; a MAD of an unregistered class will crash it",
                len(self._spare_ports),
                _UMAD2SIM_FD_SLOTS - 1,
            )

    def _open_issm(self, attrs: PortAttrs) -> None:
        assert self._lib is not None
        path = ctypes.create_string_buffer(256)
        rc = self._lib.umad_get_issm_path(attrs.ca_name.encode(), attrs.port_num, path, len(path))
        if rc < 0:
            raise TransportError(f"no issm device for {attrs.ca_name} port {attrs.port_num}: {_err(rc)}")
        # Through libc's open() by name: CPython's os.open uses open64/openat, which
        # libumad2sim does not wrap, and ibsim only sends traps to an IsSM client.
        # O_NONBLOCK: the kernel would otherwise wait until the SM holding it lets go.
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.open(path.value, os.O_RDWR | os.O_NONBLOCK)
        if fd < 0:
            err = ctypes.get_errno()
            busy = " (another SM holds this port)" if err in (errno.EAGAIN, errno.EBUSY) else ""
            raise TransportError(f"cannot open {path.value.decode()}: {os.strerror(err)}{busy}")
        self._issm_fd = fd
        self._libc = libc

    def _register(self, mclass: int, version: int, mask: _MethodMask | None, where: str, rmpp: int = 0) -> int:
        assert self._lib is not None
        ref = ctypes.byref(mask) if mask is not None else None
        agent = self._lib.umad_register(self._portid, mclass, version, rmpp, ref)
        if agent < 0:
            busy = " (another SM or agent already holds these methods on this port?)" if mask else ""
            raise TransportError(
                f"umad_register class {mclass:#04x} version {version} on {where} failed: {_err(agent)}{busy}"
            )
        return agent

    async def _close(self) -> None:
        thread = self._thread
        if thread is not None:
            self._stop.set()
            # Poll rather than join in an executor: no helper thread outlives close().
            for _ in range(int(2.0 / 0.01)):
                if not thread.is_alive():
                    break
                await asyncio.sleep(0.01)
        self._release_device()

    def _release_device(self) -> None:
        """Unregister agents, close the port and issm device, umad_done; safe to call twice."""
        thread = self._thread
        if thread is not None:
            self._stop.set()
            thread.join(2.0)
            if thread.is_alive():
                log.error("umad receive thread did not stop; leaving port %d open", self._portid)
                return
            self._thread = None
        lib = self._lib
        if lib is None:
            return
        for agent in self._agents.values():
            rc = lib.umad_unregister(self._portid, agent)
            if rc < 0:
                log.warning("umad_unregister agent %d: %s", agent, _err(rc))
        self._agents.clear()
        if self._issm_fd >= 0 and self._libc is not None:
            self._libc.close(self._issm_fd)
            self._issm_fd = -1
        for spare in self._spare_ports:
            lib.umad_close_port(spare)
        self._spare_ports.clear()
        self._sink = -1
        if self._portid >= 0:
            lib.umad_close_port(self._portid)
            self._portid = -1
        if self._inited:
            lib.umad_done()
            self._inited = False
        if self._send_view is not None:
            self._send_view.release()
        self._send_view = None
        self._send_buf = None

    # -- what the port is -------------------------------------------------------

    def _need_attrs(self) -> PortAttrs:
        if self.attrs is None:
            raise TransportError("transport not started")
        return self.attrs

    @property
    def ca_name(self) -> str:
        return self._need_attrs().ca_name

    @property
    def port_num(self) -> int:
        return self._need_attrs().port_num

    @property
    def port_guid(self) -> int:
        return self._need_attrs().port_guid

    @property
    def local_lid(self) -> int:
        return self._need_attrs().base_lid

    @property
    def sm_lid(self) -> int:
        return self._need_attrs().sm_lid

    def refresh(self) -> PortAttrs:
        """Re-read the port's LID, SM LID and state from sysfs (they change once an SM runs)."""
        attrs = self._need_attrs()
        lib = self._lib or load_libibumad()
        p = _UmadPort()
        rc = lib.umad_get_port(attrs.ca_name.encode(), attrs.port_num, ctypes.byref(p))
        if rc < 0:
            raise TransportError(f"umad_get_port {attrs.ca_name} port {attrs.port_num}: {_err(rc)}")
        try:
            self.attrs = _port_attrs(p)
        finally:
            lib.umad_release_port(ctypes.byref(p))
        return self.attrs

    def trap_source(self, mad: bytes) -> MadAddress | None:
        """Source address (LID, QP, SL) of an unsolicited MAD returned by ``next_trap``."""
        return self._trap_sources.get(mad)

    # -- wire -----------------------------------------------------------------

    def _post(self, mad: bytes, route: Route) -> None:
        self._send(mad, route, None)

    def _post_request(self, mad: bytes, route: Route, tid: int) -> None:
        self._send(mad, route, tid)

    def _send(self, mad: bytes, route: Route, tid: int | None) -> None:
        """``mad`` into the send buffer (with ``tid`` written into it, if given) and out.

        Called with the engine lock held (from the loop or the receive thread): one send buffer.
        """
        view = self._send_view
        if view is None or self._portid < 0:
            raise TransportError("transport not started")
        n = len(mad)
        if n > MAD_SIZE or n < MAD_HEADER_SIZE:
            raise ValueError(f"MAD of {n} bytes; expected {MAD_HEADER_SIZE}..{MAD_SIZE}")
        mclass = mad[1]
        addr: tuple[int, int, int]
        if mclass == MGMT_CLASS_SUBN_DR:
            if isinstance(route, int):
                raise ValueError(f"directed-route SMP needs a path, got LID {route}")
            if mad[7] != len(route):
                raise ValueError(f"DR SMP hop count {mad[7]} does not match path {list(route)}")
            addr = _DR_ADDR
        elif not isinstance(route, int):
            raise ValueError(f"class {mclass:#04x} MAD needs a destination LID, got path {list(route)}")
        elif mclass == MGMT_CLASS_SUBN_LID:
            addr = (route, 0, 0)
        elif mclass == MGMT_CLASS_PERF or (mclass == MGMT_CLASS_SA and mclass in self._agents):
            addr = (route, 1, GSI_QKEY)  # a GMP: PerfMgt, or an SA Report to a subscriber
        else:
            raise ValueError(f"management class {mclass:#04x} is not registered on this transport")
        self._send_to(mad, addr, self._agents[mclass], tid)

    def _send_to(self, mad: bytes, addr: tuple[int, int, int], agent: int, tid: int | None = None) -> None:
        """``mad`` to (DLID, QP, Q_Key) ``addr`` through ``agent``; with the engine lock held."""
        view = self._send_view
        lib = self._lib
        if view is None or lib is None or self._portid < 0:
            raise TransportError("transport not started")
        n = len(mad)
        # The header was zeroed at allocation; umad_send rewrites agent, timeout, retries and
        # length on each send, and the address only changes with the destination.
        if addr != self._send_addr:
            _set_addr(view, addr)
            self._send_addr = addr
        hs = self._hdr_size
        view[hs : hs + n] = mad
        if tid is not None:
            _TID.pack_into(view, hs + TID_OFFSET, tid)
        if n < MAD_SIZE:
            view[hs + n : hs + MAD_SIZE] = bytes(MAD_SIZE - n)
        rc = self._umad_send(self._portid, agent, self._send_buf, MAD_SIZE, 0, 0)
        if rc < 0:
            raise TransportError(f"umad_send on {self.ca_name}/{self.port_num} failed: {_err(rc)}")

    def _rx_loop(self) -> None:
        """Receive thread: umad_recv until told to stop; answers are matched right here.

        A response completes its request and posts the next one of the window
        from this thread (the engine is lock-protected), so a batch runs without
        waking the event loop per MAD; the loop hears only of a finished batch.
        Deadlines are checked here too. Unsolicited MADs (traps) go to the loop.
        """
        lib = self._lib
        loop = self._loop
        assert lib is not None and loop is not None
        hs = self._hdr_size
        # A ring of receive buffers: an answer written in place (serve(in_place=)) stays in its buffer,
        # held, while the next request comes into the next one; it is sent from there, nothing copied.
        # The loop sends what it holds before it has taken _BURST in a row, so a held buffer is never
        # received into.
        ring = [ctypes.create_string_buffer(hs + MAD_SIZE) for _ in range(_BURST)]
        views = [memoryview(b).cast("B") for b in ring]
        slot = 0
        buf, view = ring[0], views[0]
        length = ctypes.c_int()
        plen = ctypes.byref(length)
        recv = _bare(lib, "umad_recv")  # waits: lets the GIL go
        recv_now = _bare(lib, "umad_recv", keep_gil=True)  # never waits (timeout 0): keeps the GIL
        portid = self._portid
        agents = self._agents
        st = self.stats
        monotonic = time.monotonic
        next_check = 0.0
        wait_ms = 0
        stopping = self._stop.is_set
        held: list[tuple[ctypes.Array[ctypes.c_char], int, int]] = []
        burst = 0
        while True:
            length.value = MAD_SIZE
            rc = recv(portid, buf, plen, wait_ms) if wait_ms else recv_now(portid, buf, plen, 0)
            if rc >= 0:
                n = length.value
                # struct ib_user_mad.status set: a send the kernel gave back (e.g. no path), nothing came in
                if not (view[4] or view[5] or view[6] or view[7]):
                    in_place = self._in_place
                    k = 0
                    if in_place is not None:
                        lid = view[_LID] << 8 | view[_LID + 1]
                        try:
                            k = in_place(view, hs, n, lid)
                        except Exception:  # the service's bug: the request still goes the usual way
                            log.exception("in-place service failed on a request from LID %#x", lid)
                            k = 0
                    if k:  # a PathRecord Get, say: its answer stands where it was asked, to go back as it came
                        agent = agents.get(view[hs + 1])
                        if agent is None:
                            st.malformed += 1
                        else:
                            # The buffer's address is the request's (struct ib_mad_addr as the kernel wrote
                            # it: the sender's QPN, LID, SL, path bits, P_Key index and GRH); a zero Q_Key
                            # becomes the GSI's, as _reply does.
                            st.served += 1
                            if view[_QKEY : _QKEY + 4] == _NO_QKEY:
                                view[_QKEY : _QKEY + 4] = _GSI_QKEY
                            # Held while more requests wait (taken without a wait) and sent together when
                            # none does, or after _BURST: the peer (ibsim, a host's stack) is woken once for
                            # many, and this thread is not preempted by it between two requests.
                            held.append((buf, k, agent))
                            slot = slot + 1 if slot + 1 < _BURST else 0
                            buf, view = ring[slot], views[slot]
                    elif not self._received(buf, view, n):
                        break
                burst += 1
                if burst < _BURST:  # more waiting? (asked without a wait: else what is held goes)
                    wait_ms = 0
                    continue
            elif rc in (-errno.ETIMEDOUT, -errno.EINTR, -errno.EAGAIN):
                pass
            elif rc == -errno.ENOSPC:  # an RMPP answer bigger than a MAD; not ours to take
                self.rx_errors += 1
            else:
                self.rx_errors += 1
                log.error("umad_recv on %s/%s failed: %s", self.ca_name, self.port_num, _err(rc))
                if self._stop.wait(0.1):
                    break
            burst = 0
            if held:
                self._send_held(held)
            if stopping():
                break
            now = monotonic()
            if now >= next_check:
                if self._sink >= 0:
                    self._drain_sink(buf, view, length, recv)
                    now = monotonic()
                try:
                    nxt = self._expire_due(now)
                except Exception:
                    log.exception("umad deadlines on %s/%s", self.ca_name, self.port_num)
                    nxt = None
                next_check = now + _RECV_POLL_S if nxt is None else min(nxt, now + _RECV_POLL_S)
            # Block in umad_recv only until the next deadline (a fresh batch's may come sooner:
            # the poll is short enough that a timeout fires at most that late, never early).
            wait_ms = int((next_check - now) * 1000) + 1
            if wait_ms < 1:  # (no max(): a builtin that parses keywords on every call)
                wait_ms = 1
        if held:
            self._send_held(held)

    def _received(self, buf: ctypes.Array[ctypes.c_char], view: memoryview, length: int) -> bool:
        """One MAD that arrived (its bytes at the header's end of ``buf``); False when the loop is gone.

        Called on the receive thread. An answer goes to the window engine; a
        trap to the event loop, with its source; any other request is refused.
        """
        hs = self._hdr_size
        n = length if length < MAD_SIZE else MAD_SIZE
        if n < MAD_HEADER_SIZE:
            self.stats.malformed += 1
            return True
        mad = bytes(view[hs : hs + n])
        if mad[3] & 0x80:
            try:
                self._deliver(mad)
            except Exception:  # the thread must live on, or every batch would hang
                log.exception("umad answer on %s/%s not delivered", self.ca_name, self.port_num)
            return True
        assert self._loop is not None
        src = self._source(view)
        if mad[3] == METHOD_TRAP and is_trap(mad):
            self._peek(mad)  # here, on this thread: an SM announcing itself cannot wait for the loop
            try:
                self._loop.call_soon_threadsafe(self._deliver_trap, mad, src)
            except RuntimeError:  # loop closed underneath us
                return False
            return True
        if self._responder is not None and mad[1] in self._agents:
            inline = self._inline
            if inline is not None:
                try:
                    if inline(mad, src):  # answered here (a read-only SA query): no trip to the loop
                        self.stats.served += 1
                        return True
                except Exception:  # the service's bug: the request still goes the usual way
                    log.exception("inline service failed on a request from LID %#x", src.lid)
            with self._lock:
                full = self._backlog >= MAX_BACKLOG
                if not full:
                    self._backlog += 1
            if full:  # the services are behind: BUSY (hosts retry) rather than a silent drop
                self._turn_away(mad, src)
                return True
            try:  # a request of a class we hold (SMInfo from a peer, an SA query): to the service
                self._loop.call_soon_threadsafe(self._request, mad, src)
            except RuntimeError:
                return False
            return True
        self._refuse_from(mad, src)
        return True

    def _send_held(self, held: list[tuple[ctypes.Array[ctypes.c_char], int, int]]) -> None:
        """Send the answers the receive loop holds (each its buffer, the answer's length and the agent)
        and forget them; a port that refuses one (the host gone) is counted, never raised."""
        send, portid, st = self._umad_send, self._portid, self.stats
        for buf, k, agent in held:
            st.replies += 1
            if send(portid, agent, buf, k, 0, 0) < 0:
                st.reply_errors += 1
        held.clear()

    def _source(self, view: memoryview) -> MadAddress:
        """Where the MAD in the receive buffer came from: struct ib_user_mad's addr (struct ib_mad_addr)
        read in place (QPN, Q_Key, LID in network order), one :class:`MadAddress` per distinct address
        (they are immutable: a host asking again is answered with the one made for its first request)."""
        key = view[_ADDR_OFFSET : _PKEY_INDEX + 2].tobytes()
        src = self._sources.get(key)
        if src is None:
            qpn, qkey, lid, sl = _ADDR_HEAD.unpack_from(view, _ADDR_OFFSET)
            src = MadAddress(lid, qpn, qkey, sl, int.from_bytes(key[-2:], sys.byteorder))
            if len(self._sources) >= _MAX_SOURCES:
                self._sources.clear()
            self._sources[key] = src
        return src

    def _refuse_request(self, mad: bytes, src: MadAddress) -> None:
        self._refuse_from(mad, src)

    def _turn_away(self, mad: bytes, src: MadAddress) -> None:
        """Answer BUSY to a request our services have no room for (receive thread), counted."""
        self.stats.busy += 1
        answer = refusal(mad, busy=True)
        if answer is None:
            return
        agent = self._agents.get(answer[1])
        if agent is None:
            return
        if answer[1] == MGMT_CLASS_SUBN_DR:
            addr = _DR_ADDR
        elif not src.lid or src.lid >= PERMISSIVE_LID:
            return
        else:
            addr = (src.lid, 0, 0) if answer[1] == MGMT_CLASS_SUBN_LID else (src.lid, src.qpn or 1, GSI_QKEY)
        try:
            with self._lock:
                self._send_to(answer, addr, agent)
        except TransportError as e:
            log.debug("BUSY to LID %d not sent: %s", src.lid, e)

    def _reply(self, mad: bytes, to: MadAddress) -> None:
        """An answer of ours to ``to``: through the agent of its class, from the QP it was asked on.

        A directed-route SMP goes to the permissive LID (the SMP carries its way back). An SA answer
        as long as its records goes in a buffer of its own, at its length: shorter than a MAD (the
        kernel pads it; a host reads the record count off the length), or longer (the kernel's RMPP
        cuts it into segments; libumad2sim sends its first MAD).
        """
        n = len(mad)
        mclass = mad[1] if n > 1 else -1
        agent = self._agents.get(mclass)
        if agent is None:
            raise TransportError(f"no agent of class {mclass:#04x} to answer with")
        if mclass == MGMT_CLASS_SUBN_DR:
            addr = _DR_ADDR
        elif mclass == MGMT_CLASS_SUBN_LID:
            addr = (to.lid, 0, 0)
        else:
            addr = (to.lid, to.qpn or 1, to.qkey or GSI_QKEY)
        if n == MAD_SIZE:
            self._send_to(mad, addr, agent)
            return
        if self._portid < 0:
            raise TransportError("transport not started")
        if n < MAD_HEADER_SIZE:
            raise ValueError(f"answer of {n} bytes is shorter than a MAD header")
        if n > MAX_RMPP_BYTES:
            raise ValueError(f"answer of {n} bytes; at most {MAX_RMPP_BYTES}")
        hs = self._hdr_size
        buf, view = self._long_buf, self._long_view
        if buf is None or view is None or len(view) < hs + n:
            buf = self._long_buf = ctypes.create_string_buffer(hs + max(n, 4096))
            view = self._long_view = memoryview(buf).cast("B")
            self._long_addr = None
        if addr != self._long_addr:  # (umad_send rewrites agent, length and timeouts, not the address)
            _set_addr(view, addr)
            self._long_addr = addr
        view[hs : hs + n] = mad
        rc = self._umad_send(self._portid, agent, buf, n, 0, 0)
        if rc < 0:
            raise TransportError(f"umad_send of {n} bytes on {self.ca_name}/{self.port_num} failed: {_err(rc)}")

    def _refuse_from(self, mad: bytes, src: MadAddress) -> None:
        """Answer a request nobody here serves with an error status, back to where it came from.

        At most ``_REFUSALS_PER_S`` answers a second (a token bucket): beyond that a flood is
        only counted, and our own requests keep the port.
        """
        self.stats.refused += 1
        now = time.monotonic()
        self._refusal_tokens = min(_REFUSALS_PER_S, self._refusal_tokens + (now - self._refusal_t) * _REFUSALS_PER_S)
        self._refusal_t = now
        if self._refusal_tokens < 1.0:
            return
        self._refusal_tokens -= 1.0
        answer = refusal(mad)
        if answer is None:
            return
        if answer[1] == MGMT_CLASS_SUBN_DR:  # back along its return path
            addr, agent = _DR_ADDR, self._agents.get(MGMT_CLASS_SUBN_DR)
        elif not src.lid or src.lid >= PERMISSIVE_LID:
            return
        elif answer[1] == MGMT_CLASS_SUBN_LID:
            addr, agent = (src.lid, 0, 0), self._agents.get(MGMT_CLASS_SUBN_LID)
        else:  # a GMP: answered from QP1, through the GSI agent we have
            addr, agent = (src.lid, src.qpn or 1, GSI_QKEY), self._agents.get(MGMT_CLASS_PERF)
        if agent is None:
            return
        try:
            with self._lock:
                self._send_to(answer, addr, agent)
        except TransportError as e:
            log.debug("refusal to LID %d not sent: %s", src.lid, e)

    def _drain_sink(self, buf: ctypes.Array[ctypes.c_char], view: memoryview, length: ctypes.c_int, recv: Any) -> None:
        """Take every MAD waiting on libumad2sim's sink descriptor (classes with no agent) and refuse it."""
        plen = ctypes.byref(length)
        order = sys.byteorder
        until = time.monotonic() + _SINK_SLICE_S  # a flood never holds up the answers to our own requests
        while time.monotonic() < until:
            length.value = MAD_SIZE
            # umad_recv returns the MAD's agent id, -1 here (no agent has its class): whether a MAD
            # came is told by struct ib_user_mad.length, which libumad2sim writes for every MAD read.
            view[16:20] = bytes(4)
            recv(self._sink, buf, plen, 0)
            got = int.from_bytes(view[16:20], order)
            if not got:
                return
            if not (view[4] or view[5] or view[6] or view[7]):
                self._received(buf, view, got - self._hdr_size)

    def _deliver_trap(self, mad: bytes, src: MadAddress) -> None:
        self._trap_sources[mad] = src
        while len(self._trap_sources) > 1024:
            self._trap_sources.popitem(last=False)
        self._deliver(mad)
