"""SM election and handover (SMInfo, IBA 14.4): who of the SMs on a subnet is its master.

``elector`` owns the SM's own SMInfo (state, priority, SM_Key, ActCount),
answers SubnGet/SubnSet(SMInfo) from peer SMs (the transport's service
hook), and drives the state machine: DISCOVERING until a heavy sweep's
discovery has asked every other SM port (IsSM) for its SMInfo, then MASTER
or STANDBY; a STANDBY polls its master and takes over when it stops
answering; a MASTER hands the subnet over to a better SM. The manager asks
it, after discovery, whether this sweep may write to the fabric.

Interoperates with OpenSM 3.3.23 as its sources and our runs show it: the
same ranking (priority, then the lower port GUID), HANDOVER by a
directed-route SubnSet(SMInfo) with no ACKNOWLEDGE awaited, Trap 144
(SM priority change) from a STANDBY to a lower master, and SM_Key 1 by
default (OpenSM ignores an SMInfo carrying another key).

May import ``fabric``, ``sm.transport`` and the discovery types of ``sm.sweep``.
"""
