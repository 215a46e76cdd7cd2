"""What only reads a snapshot or a routing, and changes nothing.

Route verification (``verify``), the credit-loop check (``creditflow``), the max-min fluid
congestion model (``flowmodel``) and the traffic patterns it runs (``patterns``), failures
tried on a copy (``whatif``), route queries by name, GUID or LID (``query``),
ibdiagnet-style checks and cabling validation (``validate``), ibroute-format dumps (``dump``).
Imports ``fabric``, ``sm.lidmap``, ``sm.links`` and ``sm.routing``; never the sweep or its manager.
"""
