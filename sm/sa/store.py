"""What the SA remembers between requests: the records hosts registered (IBA 15.2.5).

The snapshot holds what the fabric is; the store holds what hosts asked
for: ServiceRecords (with leases), InformInfo subscriptions, alias GUIDs,
multicast members. It lives as long as the SA (it survives sweeps; a new
master starts it empty, as hosts re-register when told to). Only the SA's
families write it, on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SaStore:
    services: dict[Any, Any] = field(default_factory=dict)
    """ServiceRecords by their key (ServiceID, ServiceGID, ServiceP_Key)."""
    subscriptions: dict[Any, Any] = field(default_factory=dict)
    """InformInfo subscriptions by (subscriber GID, trap range, type, producer)."""
    alias_guids: dict[Any, Any] = field(default_factory=dict)
    """Alias GUIDs by (port GUID, block)."""
