"""Subnet Administration (SA, management class 0x03): the SM's answers to hosts.

``server`` takes SA requests from the transport, checks them, finds the
record family of their attribute and answers: GetResp with one record,
GetTableResp with all that match (in RMPP segments where the transport does
not segment), status codes instead of exceptions, BUSY under overload.
Every record family is one module, as OpenSM's ``osm_sa_*_record.c`` files
are; each builds its records from the current immutable
:class:`~sm.sweep.manager.SubnetSnapshot` (as packed numpy rows, built once
per snapshot and matched by component mask in one array operation) or, for
the stateful families (ServiceRecord, InformInfo, alias GUIDs, multicast
members), from the small store the SA owns (``store``).

May import ``fabric``, ``sm.lidmap``, ``sm.links``, ``sm.transport`` and the
snapshot types of ``sm.sweep``; nothing in the sweep imports the SA.
"""
