"""QoS: OpenSM's qos_* options and QoS policy file, and the SL2VL and VL arbitration tables they make.

``config`` parses and checks the options (per port type: CA, switch external port, switch
port 0, router) and a subset of OpenSM's ``qos-policy.conf`` (port groups, QoS levels, match
rules) with every error located; ``plan`` resolves them onto a fabric as ``osm_qos.c`` does:
each port's SLtoVLMappingTables and VLArbitrationTable blocks reduced to its operational VLs,
SL k on VL k for a layered routing engine's layers, and the QoS level (SL) of a path.

May import ``fabric`` only; the sweep and the SA import this package, never the reverse.
"""

from sm.qos.config import (
    DEFAULT_OPTIONS,
    PORT_TYPES,
    MatchRule,
    PortGroup,
    QosConfig,
    QosLevel,
    QosOptions,
    QosPolicy,
    QosPolicyError,
    build_options,
    load_qos_policy,
    parse_qos_policy,
    parse_sl2vl,
    parse_vlarb,
)
from sm.qos.plan import QosPlan, plan_qos, vl_mask

__all__ = [
    "DEFAULT_OPTIONS",
    "PORT_TYPES",
    "MatchRule",
    "PortGroup",
    "QosConfig",
    "QosLevel",
    "QosOptions",
    "QosPlan",
    "QosPolicy",
    "QosPolicyError",
    "build_options",
    "load_qos_policy",
    "parse_qos_policy",
    "parse_sl2vl",
    "parse_vlarb",
    "plan_qos",
    "vl_mask",
]
