"""The sweeps, and the manager that runs them.

A heavy sweep is a fixed list of stages: discovery by directed route (``discover``), the LID
plan kept in OpenSM's guid2lid file (``lids``), routing and its checks in a forked child
(``offload``), programming PortInfo, SwitchInfo, LFT blocks and port states (``program``).
The light sweep (``light``) finds link changes cheaply and feeds the next heavy sweep. The
``manager`` owns the loop, merges triggers, publishes an immutable ``SubnetSnapshot`` and
emits typed ``events``. Imports ``transport``, ``routing``, ``analysis``, ``lidmap``, ``links``.
"""
