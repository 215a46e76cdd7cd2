"""Partitions: OpenSM's partitions file, and the PKeyTables and enforcement it makes of a fabric.

``config`` parses ``partitions.conf`` (OpenSM 3.3.23's format) into an immutable, merged
model with every error located (file, line, column), as OpenSM's ``osm_prtn_config.c``
reads it; ``plan`` resolves that model onto a fabric snapshot the way ``osm_prtn.c`` and
``osm_pkey_mgr.c`` do: each end port's PKeyTable with stable indexes, the switch ports
that enforce for their CAs, and the 64-byte blocks that changed.

May import ``fabric`` only; the sweep imports this package, never the reverse.
"""

from sm.partitions.config import (
    DEFAULT_PKEY,
    McGroupSpec,
    Member,
    Partition,
    PartitionConfig,
    PartitionConfigError,
    default_partitions,
    load_partitions,
    parse_partitions,
)
from sm.partitions.plan import PartitionPlan, PortKeys, changed_blocks, pkey_blocks, plan_partitions

__all__ = [
    "DEFAULT_PKEY",
    "McGroupSpec",
    "Member",
    "Partition",
    "PartitionConfig",
    "PartitionConfigError",
    "PartitionPlan",
    "PortKeys",
    "changed_blocks",
    "default_partitions",
    "load_partitions",
    "parse_partitions",
    "pkey_blocks",
    "plan_partitions",
]
