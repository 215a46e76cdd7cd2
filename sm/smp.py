"""SMP Get/Set over a transport, with status checks that name the target.

A route is a directed-route path (tuple of output ports) or a LID; the
request is built as a DR or a LID-routed SMP accordingly. A non-zero
status raises :class:`SmpError` naming route, attribute and status.
"""

from __future__ import annotations

from collections.abc import Mapping

from fabric.errors import IbfmError
from fabric.mad import SMP_DATA_SIZE, Layout, Method, parse_mad, smp_dr, smp_lid
from fabric.mad.fields import FieldValue
from sm.transport.base import Route, WindowedTransport, describe_route


class SmpError(IbfmError):
    """An SMP answered with a bad status or an unexpected layout."""


async def smp_get_raw(
    transport: WindowedTransport, route: Route, attr_id: int, attr_mod: int = 0, data: bytes = b""
) -> bytes:
    """Send a Get; returns the attribute data of the GetResp (64 bytes)."""
    return await _exchange(transport, route, Method.GET, attr_id, attr_mod, data)


async def smp_set_raw(
    transport: WindowedTransport, route: Route, attr_id: int, attr_mod: int, data: bytes
) -> bytes:
    """Send a Set; returns the attribute data of the GetResp (the device's state after it)."""
    return await _exchange(transport, route, Method.SET, attr_id, attr_mod, data)


async def smp_get(
    transport: WindowedTransport, route: Route, layout: Layout, attr_id: int, attr_mod: int = 0
) -> dict[str, FieldValue]:
    return layout.unpack(await smp_get_raw(transport, route, attr_id, attr_mod))


async def smp_set(
    transport: WindowedTransport,
    route: Route,
    layout: Layout,
    attr_id: int,
    attr_mod: int,
    values: Mapping[str, FieldValue],
    base: bytes | None = None,
) -> dict[str, FieldValue]:
    """Set ``values`` (over ``base``, e.g. the attribute as last read) and return the answer decoded."""
    data = layout.pack(values, base=base)
    return layout.unpack(await smp_set_raw(transport, route, attr_id, attr_mod, data))


async def _exchange(
    transport: WindowedTransport, route: Route, method: int, attr_id: int, attr_mod: int, data: bytes
) -> bytes:
    if len(data) > SMP_DATA_SIZE:
        data = data[:SMP_DATA_SIZE]
    if isinstance(route, int):
        req = smp_lid(method, attr_id, attr_mod, 0, data)
    else:
        req = smp_dr(method, attr_id, attr_mod, 0, route, data)
    resp = parse_mad(await transport.send(req, route))
    if resp.attr_id != attr_id:
        raise SmpError(
            f"{describe_route(route)}: answer for attribute {resp.attr_id:#06x}, asked {attr_id:#06x}"
        )
    if resp.status:
        raise SmpError(
            f"{describe_route(route)}: {'Set' if method == Method.SET else 'Get'} of attribute "
            f"{attr_id:#06x} modifier {attr_mod:#x} answered status {resp.status:#06x}"
        )
    return resp.data
