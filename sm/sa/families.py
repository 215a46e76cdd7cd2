"""Every SA record family ibfm answers, one module each (as OpenSM's osm_sa_*_record.c files)."""

from __future__ import annotations

from sm.sa.class_port_info import ClassPortInfoFamily
from sm.sa.guid_info_record import GuidInfoRecordFamily
from sm.sa.inform_info import InformInfoFamily, InformInfoRecordFamily
from sm.sa.link_record import LinkRecordFamily
from sm.sa.mcmember_record import McMemberRecordFamily
from sm.sa.node_record import NodeRecordFamily
from sm.sa.path_record import PathRecordFamily
from sm.sa.port_info_record import PortInfoRecordFamily
from sm.sa.port_tables import PKeyTableRecordFamily, Sl2VlTableRecordFamily, VlArbTableRecordFamily
from sm.sa.server import Family
from sm.sa.service_record import ServiceRecordFamily
from sm.sa.sm_info_record import SmInfoRecordFamily
from sm.sa.switch_records import LftRecordFamily, MftRecordFamily, SwitchInfoRecordFamily


def all_families() -> list[Family]:
    """A fresh instance of every family (stateful ones keep their state in the SA's store)."""
    return [
        ClassPortInfoFamily(),
        SwitchInfoRecordFamily(),
        LftRecordFamily(),
        MftRecordFamily(),
        Sl2VlTableRecordFamily(),
        PKeyTableRecordFamily(),
        VlArbTableRecordFamily(),
        GuidInfoRecordFamily(),
        NodeRecordFamily(),
        PortInfoRecordFamily(),
        SmInfoRecordFamily(),
        LinkRecordFamily(),
        PathRecordFamily(),
        ServiceRecordFamily(),
        InformInfoFamily(),
        InformInfoRecordFamily(),
        McMemberRecordFamily(),
    ]
