"""What most record families share: records packed once per snapshot, selected by component mask.

A :class:`TableFamily` builds every record of its attribute from the
snapshot as one ``uint8[n, size]`` array (cached in the request context
until the snapshot changes); a query keeps the rows whose bytes under the
component mask equal the query's (one numpy comparison over only the
columns the mask touches). Families whose answers depend on the request
in other ways (PathRecord, the stateful stores) implement ``query`` themselves.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from fabric.mad.fields import Layout
from fabric.mad.sa import SaMethod, SaStatus, match_mask, record_layout
from sm.sa.server import Rows, SaContext, SaError, SaRequest

GET_METHODS = frozenset({int(SaMethod.GET), int(SaMethod.GET_TABLE)})


def select(attr: int, rows: Rows, query: bytes, mask: int) -> Rows:
    """The rows of ``rows`` (records of ``attr``) that match ``query`` on the components of ``mask``."""
    if not mask or not rows.shape[0]:
        return rows
    m, cols = match_mask(attr, mask)
    if not cols:
        return rows
    idx = np.frombuffer(cols, np.uint8).astype(np.intp)
    mm = np.frombuffer(m, np.uint8)[idx]
    q = np.frombuffer(query[: len(m)].ljust(len(m), b"\0"), np.uint8)[idx] & mm
    hit = ((rows[:, idx] & mm) == q).all(axis=1)
    return rows[hit]


def empty(size: int) -> Rows:
    return np.zeros((0, size), np.uint8)


class TableFamily:
    """Records built once per snapshot (:meth:`build`), matched by component mask."""

    attr: ClassVar[int]
    size: ClassVar[int]
    layout: ClassVar[Layout]
    methods: ClassVar[frozenset[int]] = GET_METHODS
    trusted_only: ClassVar[bool] = False
    """Answered only to requests with the SA's SM_Key (others: ERR_REQ_INVALID, as OpenSM)."""
    reads_only: ClassVar[bool] = True
    """Get and GetTable read only the snapshot (not the SA's store): answerable off the event loop."""

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        if "attr" in cls.__dict__:
            cls.layout = record_layout(cls.attr)
            cls.size = cls.layout.size

    def build(self, ctx: SaContext) -> Rows:
        """Every record of this family in the snapshot, packed."""
        raise NotImplementedError

    def warm(self, cache: dict[str, object]) -> bool:
        """Whether this snapshot's records are built already (a query then costs one comparison)."""
        return f"table:{self.attr:#06x}" in cache

    def rows(self, ctx: SaContext) -> Rows:
        key = f"table:{self.attr:#06x}"
        got = ctx.cache.get(key)
        if got is None:
            got = ctx.cache[key] = self.build(ctx)
        return got  # type: ignore[no-any-return]

    def query(self, ctx: SaContext, req: SaRequest) -> Rows:
        if self.trusted_only and not req.trusted:
            raise SaError(SaStatus.ERR_REQ_INVALID, "privileged record: the SA key is needed")
        return select(self.attr, self.rows(ctx), req.mad.data, req.mask)
