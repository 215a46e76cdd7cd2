"""The performance manager: PMA PortCounters and PortCountersExtended into counter arrays.

Reads every port's counters over the transport each counter sweep, clears 32-bit counters
before they wrap, and keeps totals and rates as numpy arrays for the exporters. Imports
``fabric``, ``sm.transport`` and ``sm.lidmap``; reads snapshots handed to it, never the manager.
"""
