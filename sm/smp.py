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
    (res,) = await smp_batch(transport, [(route, method, attr_id, attr_mod, data[:SMP_DATA_SIZE])])
    if isinstance(res, IbfmError):
        raise res
    return res


SmpRequest = tuple[Route, int, int, int, bytes]
"""(route, method, attribute ID, attribute modifier, data)."""


async def smp_batch(transport: WindowedTransport, requests: list[SmpRequest]) -> list[bytes | IbfmError]:
    """Send every SMP under the window; per request the attribute data, or the error naming it."""
    mads = [
        (
            smp_lid(m, a, mod, 0, data) if isinstance(route, int) else smp_dr(m, a, mod, 0, route, data),
            route,
        )
        for route, m, a, mod, data in requests
    ]
    answers = await transport.send_many(mads)
    out: list[bytes | IbfmError] = []
    for (route, method, attr_id, attr_mod, _), ans in zip(requests, answers, strict=True):
        if not isinstance(ans, bytes):
            out.append(ans if isinstance(ans, IbfmError) else SmpError(f"{describe_route(route)}: {ans}"))
            continue
        try:
            resp = parse_mad(ans)
        except IbfmError as e:
            out.append(SmpError(f"{describe_route(route)}: malformed answer: {e}"))
            continue
        if resp.attr_id != attr_id or resp.status:
            out.append(
                SmpError(
                    f"{describe_route(route)}: {'Set' if method == Method.SET else 'Get'} of attribute "
                    f"{attr_id:#06x} modifier {attr_mod:#x} answered status {resp.status:#06x}"
                    + (f" for attribute {resp.attr_id:#06x}" if resp.attr_id != attr_id else "")
                )
            )
            continue
        out.append(resp.data)
    return out
