"""ClassPortInfo of the SA (IBA 15.2.5.1): what this SA supports, and where its traps go.

CapabilityMask and CapabilityMask2 advertise exactly what ibfm answers: as
OpenSM 3.3.23 serving multicast (osm_sa_class_port_info.c), IsUDMulticastSupported
(MCMemberRecord joins and leaves, :mod:`sm.sa.mcmember_record`) and
IsSendOnlyFullMemberSupported (the kernel's IB_SA_CAP_MASK2_SENDONLY_FULL_MEM_SUPPORT:
IPoIB then joins its send-only groups as SendOnlyFullMember, which may create a
group). Not IsMultiPathSupported (no GetMulti) nor IsMulticastServiceRecordsSupported
(ServiceRecords name ports only), which OpenSM 3.3.23 advertises. The rest as
OpenSM 3.3.23 answers on ibsim: RespTimeValue 16 (its 200 ms transaction timeout),
the redirect and trap Q_Keys of the GSI (0x80010000), redirect QP 1.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from fabric.mad import CLASS_PORT_INFO
from fabric.mad.sa import SA_CLASS_VERSION, SaAttr, SaCap, SaCap2, SaMethod
from sm.sa.server import Rows, SaContext, SaRequest

CAPABILITIES = (
    SaCap.IS_GET_SET_NOTICE_SUPPORTED | SaCap.IS_PORT_INFO_CAPMASK_MATCH_SUPPORTED | SaCap.IS_UD_MULTICAST_SUPPORTED
)
CAPABILITIES2 = (
    SaCap2.IS_MULTICAST_FDB_TOP_SUPPORTED
    | SaCap2.IS_ALIAS_GUIDS_SUPPORTED
    | SaCap2.IS_FULL_PORT_INFO_RECORDS_SUPPORTED
    | SaCap2.IS_EXTENDED_SPEEDS_SUPPORTED
    | SaCap2.IS_PORT_INFO_CAPMASK2_MATCH_SUPPORTED
    | SaCap2.IS_SEND_ONLY_FULL_MEMBER_SUPPORTED
    | SaCap2.IS_LINK_WIDTH_2X_SUPPORTED
    | SaCap2.IS_LINK_SPEED_HDR_SUPPORTED
)
RESP_TIME_VALUE = 16
GSI_QKEY = 0x80010000


class ClassPortInfoFamily:
    reads_only: ClassVar[bool] = True
    is_attribute: ClassVar[bool] = True
    """Answered as one whole MAD with AttributeOffset 0, not as a table of records."""
    attr: ClassVar[int] = int(SaAttr.CLASS_PORT_INFO)
    size: ClassVar[int] = CLASS_PORT_INFO.size
    methods: ClassVar[frozenset[int]] = frozenset({int(SaMethod.GET)})

    def query(self, ctx: SaContext, req: SaRequest) -> Rows:
        rec = CLASS_PORT_INFO.pack(
            {
                "BaseVersion": 1,
                "ClassVersion": SA_CLASS_VERSION,
                "CapabilityMask": int(CAPABILITIES),
                "CapabilityMask2": int(CAPABILITIES2),
                "RespTimeValue": RESP_TIME_VALUE,
                "RedirectQP": 1,
                "RedirectQ_Key": GSI_QKEY,
                "TrapQ_Key": GSI_QKEY,
            }
        )
        return np.frombuffer(rec, np.uint8).reshape(1, -1)
