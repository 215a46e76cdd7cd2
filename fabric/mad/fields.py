"""Declarative attribute layouts and the one codec that packs and unpacks them.

Every MAD attribute is a table of :class:`Field` rows (name, bit offset, bit
width) copied from the IBA spec's attribute tables, like libibmad's
``fields.c``. Offsets count from the first bit of the attribute with big-endian
bit numbering: bit 0 is the most significant bit of byte 0, so a field at
offset 260 of width 4 is the low nibble of byte 32.

A :class:`Layout` validates its table once (no overlap, fits the attribute) and
compiles it into straight-line Python: ``unpack`` turns the whole attribute
into one ``int`` with ``int.from_bytes`` and takes each field out with a
constant shift and mask; ``pack`` does the reverse. Fields wider than 64 bits
(GIDs, NodeDescription, LFT blocks, DataDetails) must be byte aligned and are
``bytes`` values. Reserved bits are simply absent from the tables; ``pack``
leaves them zero, or as they are in ``base``.
"""

from __future__ import annotations

import itertools
import operator
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from fabric.mad.errors import FieldValueError, MadError

FieldValue = int | bytes


def _as_index(value: FieldValue) -> int | None:
    """``value`` as an exact integer (int, bool, numpy integer); None for bytes, floats, text and the like."""
    if isinstance(value, bytes | bytearray | memoryview):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


#: Column at which ``Layout.dump`` starts values, as libibmad's dumps do.
DUMP_COLUMN = 33


@dataclass(frozen=True, slots=True)
class Field:
    """One row of an attribute table.

    ``fmt`` says how dumps show the value: ``"uint"``, ``"hex"``, ``"bytes"``
    (hex string), ``"str"`` (NUL-padded text) or ``"flags"`` (set bits named
    from ``values``, joined by " or "). ``values`` names enumerated codes
    (PortState 4 -> "Active"). ``ibmad`` is the label libibmad prints
    for the field (``smpquery``'s "LinkState" for PortState), used to compare
    with infiniband-diags output.
    """

    name: str
    offset: int
    width: int
    fmt: str = field(default="", kw_only=True)
    values: Mapping[int, str] | None = field(default=None, kw_only=True, compare=False)
    ibmad: str | None = field(default=None, kw_only=True)

    @property
    def is_bytes(self) -> bool:
        """Whether values are ``bytes`` (fields wider than 64 bits)."""
        return self.width > 64

    @property
    def max_value(self) -> int:
        """Largest integer the field holds."""
        return (1 << self.width) - 1

    @property
    def end(self) -> int:
        """First bit after the field."""
        return self.offset + self.width

    @property
    def dump_fmt(self) -> str:
        """The effective dump format (``fmt`` or a default from the width)."""
        if self.fmt:
            return self.fmt
        if self.is_bytes:
            return "bytes"
        return "hex" if self.width >= 32 else "uint"


class Layout:
    """An attribute's field table, compiled once into fast ``pack``/``unpack``.

    ``unpack(buf, offset=0)`` reads ``size`` bytes at ``offset`` and returns
    ``{name: value}``; ``pack(values, base=None)`` returns ``size`` bytes,
    taking fields missing from ``values`` from ``base`` (or 0). A value that
    does not fit its field raises :class:`FieldValueError` (a ``ValueError``)
    naming the layout and field; an unknown field name raises it too.
    """

    __slots__ = (
        "_by_name", "_getters", "_source", "_struct", "fields", "name", "names", "pack", "size", "unpack",
    )

    fields: tuple[Field, ...]
    name: str
    names: frozenset[str]
    size: int
    unpack: Callable[..., dict[str, FieldValue]]
    pack: Callable[..., bytes]

    def __init__(self, name: str, size_bytes: int, fields: Iterable[Field]) -> None:
        self.name = name
        self.size = size_bytes
        self.fields = tuple(fields)
        if size_bytes <= 0:
            raise MadError(f"layout {name}: size {size_bytes} bytes is not positive")
        self._check()
        self._by_name = {f.name: f for f in self.fields}
        self.names = frozenset(self._by_name)
        self._getters = {f.name: self._getter(f) for f in self.fields}
        self.unpack, self.pack = self._compile()

    # --- construction -----------------------------------------------------

    def _check(self) -> None:
        bits = self.size * 8
        seen: set[str] = set()
        for f in self.fields:
            where = f"layout {self.name}, field {f.name}"
            if f.name in seen:
                raise MadError(f"{where}: duplicate field name")
            seen.add(f.name)
            if not f.name.isidentifier():
                raise MadError(f"{where}: name is not an identifier")
            if f.width <= 0 or f.offset < 0:
                raise MadError(f"{where}: offset {f.offset} width {f.width} invalid")
            if f.end > bits:
                raise MadError(f"{where}: bits {f.offset}..{f.end - 1} exceed the {self.size}-byte attribute")
            if f.is_bytes and (f.offset % 8 or f.width % 8):
                raise MadError(f"{where}: a field wider than 64 bits must be byte aligned")
        ordered = sorted(self.fields, key=lambda f: f.offset)
        for a, b in itertools.pairwise(ordered):
            if b.offset < a.end:
                raise MadError(
                    f"layout {self.name}: field {b.name} (bit {b.offset}) overlaps "
                    f"{a.name} (bits {a.offset}..{a.end - 1})"
                )

    def _getter(self, f: Field) -> tuple[int, int, int, int, bool]:
        first = f.offset // 8
        last = (f.end + 7) // 8
        shift = last * 8 - f.end
        return first, last, shift, f.max_value, f.is_bytes

    def _chunks(self) -> list[tuple[int, int, bool]]:
        """Split the attribute into struct items: (first byte, length, is a bytes field).

        Bytes fields become ``Ns`` items; the rest is cut greedily into big-endian
        8/4/2/1-byte integers, so every integer field lies in one or a few small words.
        """
        byte_fields = sorted((f.offset // 8, f.end // 8) for f in self.fields if f.is_bytes)
        int_fields = [(f.offset, f.end) for f in self.fields if not f.is_bytes]
        chunks: list[tuple[int, int, bool]] = []

        def cost(a: int, n: int) -> int:
            lo, hi = a * 8, (a + n) * 8
            return 1 + sum(1 for s, e in int_fields if s < hi and e > lo)

        def ints(a: int, b: int) -> None:
            # Fewest (chunk + field piece) operations: a field cut across chunks costs extra work.
            best: dict[int, tuple[int, list[int]]] = {b: (0, [])}
            for p in range(b - 1, a - 1, -1):
                best[p] = min(
                    (cost(p, n) + best[p + n][0], [n, *best[p + n][1]]) for n in (8, 4, 2, 1) if p + n <= b
                )
            for n in best[a][1]:
                chunks.append((a, n, False))
                a += n

        pos = 0
        for a, b in byte_fields:
            ints(pos, a)
            chunks.append((a, b - a, True))
            pos = b
        ints(pos, self.size)
        return chunks

    def _compile(self) -> tuple[Callable[..., dict[str, FieldValue]], Callable[..., bytes]]:
        chunks = self._chunks()
        fmt = ">" + "".join(f"{n}s" if is_b else {8: "Q", 4: "I", 2: "H", 1: "B"}[n] for _, n, is_b in chunks)
        st = struct.Struct(fmt)
        self._struct = st
        assert st.size == self.size
        cnames = [f"c{i}" for i in range(len(chunks))]
        ns: dict[str, Any] = {
            "_st": st,
            "_unpack_from": st.unpack_from,
            "_pack": st.pack,
            "_struct_error": struct.error,
            "_index": operator.index,
            "_names": self.names,
            "_short": self._short,
            "_bad": self._bad,
            "_unknown": self._unknown,
            "_slow_pack": self._slow_pack,
            "_base": self._base_chunks,
        }

        def pieces(f: Field) -> list[tuple[int, int, int]]:
            """(chunk index, shift of the field's low bit, bits in chunk) from high to low part."""
            out = []
            for i, (a, n, _) in enumerate(chunks):
                lo_bit, hi_bit = a * 8, (a + n) * 8
                s0, e0 = max(f.offset, lo_bit), min(f.end, hi_bit)
                if s0 < e0:
                    out.append((i, hi_bit - e0, e0 - s0))
            return out

        # unpack: one struct call, then shifts and masks on small ints.
        items = []
        for f in self.fields:
            ps = pieces(f)
            if f.is_bytes:
                items.append(f"{f.name!r}: {cnames[ps[0][0]]}")
                continue
            parts = []
            rest = f.width
            for i, shift, nbits in ps:
                rest -= nbits
                part = cnames[i]
                if shift:
                    part = f"({part} >> {shift})"
                if shift + nbits < chunks[i][1] * 8:
                    part = f"({part} & {(1 << nbits) - 1:#x})"
                if rest:
                    part = f"({part} << {rest})"
                parts.append(part)
            expr = " | ".join(parts)
            items.append(f"{f.name!r}: {expr}")
        src = [
            "def unpack(buf, offset=0):",
            "    try:",
            f"        {', '.join(cnames)}, = _unpack_from(buf, offset)",
            "    except _struct_error:",
            "        _short(buf, offset)",
            "    return {" + ", ".join(items) + "}",
        ]
        # pack: per present field, range check then clear and insert into its chunk(s).
        zero = ", ".join(f"b'\\0' * {n}" if is_b else "0" for _, n, is_b in chunks)
        src += [
            "def pack(values, base=None):",
            "    if not _names.issuperset(values):",
            "        _unknown(values)",
            "    if base is None:",
            f"        {', '.join(cnames)}, = {zero},",
            "    else:",
            f"        {', '.join(cnames)}, = _base(base)",
            "    g = values.get",
            "    try:",
        ]
        for f in self.fields:
            ps = pieces(f)
            src.append(f"        x = g({f.name!r})")
            src.append("        if x is not None:")
            if f.is_bytes:
                src.append(f"            if len(x) != {f.width // 8}:")
                src.append(f"                _bad({f.name!r}, x)")
                src.append(f"            {cnames[ps[0][0]]} = bytes(x)")
                continue
            src.append("            x = _index(x)")
            src.append(f"            if x < 0 or x > {f.max_value:#x}:")
            src.append(f"                _bad({f.name!r}, x)")
            rest = f.width
            for i, shift, nbits in ps:
                rest -= nbits
                chunk_mask = (1 << (chunks[i][1] * 8)) - 1
                clear = chunk_mask ^ (((1 << nbits) - 1) << shift)
                part = f"(x >> {rest})" if rest else "x"
                if nbits + rest < f.width:
                    part = f"({part} & {(1 << nbits) - 1:#x})"
                if shift:
                    part = f"({part} << {shift})"
                c = cnames[i]
                if clear == 0:
                    src.append(f"            {c} = {part}")
                else:
                    src.append(f"            {c} = {c} & {clear:#x} | {part}")
        src += [
            "    except TypeError:",
            "        _slow_pack(values)",
            "        raise",
            f"    return _pack({', '.join(cnames)})",
        ]
        code = "\n".join(src)
        exec(compile(code, f"<layout {self.name}>", "exec"), ns)
        self._source = code
        return ns["unpack"], ns["pack"]

    # --- error paths (kept out of the generated fast path) -----------------

    def _short(self, buf: Any, offset: int) -> NoReturn:
        raise MadError(
            f"{self.name}: need {self.size} bytes at offset {offset}, buffer has {len(buf)} bytes"
        )

    def _bad(self, name: str, value: Any) -> NoReturn:
        f = self._by_name[name]
        if f.is_bytes:
            raise FieldValueError(
                f"{self.name}.{name}: needs {f.width // 8} bytes, got {len(value)}"
            )
        raise FieldValueError(
            f"{self.name}.{name}: value {value!r} does not fit {f.width} bits (0..{f.max_value})"
        )

    def _unknown(self, values: Mapping[str, Any]) -> None:
        extra = sorted(k for k in values if k not in self._by_name)
        raise FieldValueError(f"{self.name}: unknown field(s) {', '.join(map(str, extra))}")

    def _slow_pack(self, values: Mapping[str, Any]) -> None:
        """Find the field whose value has the wrong type; raise naming it."""
        for f in self.fields:
            x = values.get(f.name)
            if x is None:
                continue
            try:
                if f.is_bytes:
                    if isinstance(x, str):
                        raise TypeError
                    int.from_bytes(x, "big")
                else:
                    operator.index(x)
            except TypeError:
                kind = "bytes" if f.is_bytes else "an integer"
                raise FieldValueError(
                    f"{self.name}.{f.name}: needs {kind}, got {type(x).__name__} {x!r}"
                ) from None

    def _base_chunks(self, base: Any) -> tuple[Any, ...]:
        if len(base) != self.size:
            raise MadError(f"{self.name}: base is {len(base)} bytes, needs {self.size}")
        return self._struct.unpack(base)

    # --- single fields ----------------------------------------------------

    def field(self, name: str) -> Field:
        """The :class:`Field` called ``name``."""
        try:
            return self._by_name[name]
        except KeyError:
            raise MadError(f"{self.name}: no field {name!r}") from None

    def get(self, buf: Any, name: str, offset: int = 0) -> FieldValue:
        """One field of the attribute at ``offset`` in ``buf``, without unpacking the rest."""
        try:
            first, last, shift, mask, is_bytes = self._getters[name]
        except KeyError:
            raise MadError(f"{self.name}: no field {name!r}") from None
        if len(buf) < offset + self.size:
            self._short(buf, offset)
        chunk = buf[offset + first : offset + last]
        if is_bytes:
            return bytes(chunk)
        return int.from_bytes(chunk, "big") >> shift & mask

    def put(self, buf: bytearray | memoryview, name: str, value: FieldValue, offset: int = 0) -> None:
        """Write one field in place into the attribute at ``offset`` in ``buf``."""
        f = self.field(name)
        first, last, shift, mask, is_bytes = self._getters[name]
        if len(buf) < offset + self.size:
            self._short(buf, offset)
        if is_bytes:
            if isinstance(value, int) or len(value) != f.width // 8:
                self._bad(name, value if not isinstance(value, int) else b"")
            buf[offset + first : offset + last] = bytes(value)
            return
        x = _as_index(value)
        if x is None:
            raise FieldValueError(
                f"{self.name}.{name}: needs an integer, got {type(value).__name__} {value!r}"
            )
        if x < 0 or x > mask:
            self._bad(name, x)
        old = int.from_bytes(buf[offset + first : offset + last], "big")
        new = old & ~(mask << shift) | x << shift
        buf[offset + first : offset + last] = new.to_bytes(last - first, "big")

    # --- presentation -----------------------------------------------------

    def format_value(self, name: str, value: FieldValue) -> str:
        """One value as dumps show it (enum name, hex, text)."""
        f = self.field(name)
        fmt = f.dump_fmt
        if isinstance(value, bytes | bytearray | memoryview):
            raw = bytes(value)
            if fmt == "str":
                return raw.split(b"\0", 1)[0].decode("utf-8", "replace")
            return "0x" + raw.hex()
        if fmt == "flags" and f.values is not None and value:
            names = [f.values[bit] for bit in sorted(f.values) if value & bit]
            if sum(bit for bit in f.values if value & bit) == value:
                return " or ".join(names)
            return f"0x{value:x}"
        if f.values is not None and value in f.values:
            return f.values[value]
        if fmt == "hex":
            return f"0x{value:0{(f.width + 3) // 4}x}"
        return str(value)

    def dump(self, values: Mapping[str, FieldValue], *, ibmad_names: bool = False) -> str:
        """libibmad-style text, one ``Name:.......value`` line per field present in ``values``."""
        lines = []
        for f in self.fields:
            if f.name not in values:
                continue
            label = (f.ibmad or f.name) if ibmad_names else f.name
            lines.append(f"{label}:".ljust(DUMP_COLUMN, ".") + self.format_value(f.name, values[f.name]))
        return "\n".join(lines)

    def to_json(self, values: Mapping[str, FieldValue]) -> dict[str, int | str]:
        """``values`` with bytes as hex strings (text fields decoded), ready for JSON."""
        out: dict[str, int | str] = {}
        for f in self.fields:
            if f.name not in values:
                continue
            v = values[f.name]
            out[f.name] = self.format_value(f.name, v) if isinstance(v, bytes | bytearray) else int(v)
        return out

    def __repr__(self) -> str:
        return f"Layout({self.name!r}, {self.size} bytes, {len(self.fields)} fields)"
