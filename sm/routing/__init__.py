"""Routing engines, one per module, chosen by name and tried in order (as OpenSM's ``-R``).

Each engine is a pure function of a fabric and its LID map that returns the LFTs or refuses
the topology with a typed error (``base``). Imports ``fabric``, ``sm.lidmap`` and the analyses
an engine checks itself with; never the sweep.
"""
