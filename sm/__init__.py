"""The subnet manager: everything that talks to the fabric or reasons about its routes.

Packages by function, as OpenSM groups its files by prefix:

- ``transport``: MAD bytes out and in (libibumad, the emulated fabric), and SMP batches over them;
- ``routing``: one engine per module (ftree, updn, minhop) behind one Protocol;
- ``sweep``: the heavy sweep's stages (discovery, LIDs, programming), the light sweep, and the
  manager that runs them and publishes snapshots and events;
- ``analysis``: what only reads a snapshot or a routing (verification, credit loops, the fluid
  congestion model, traffic patterns, what-if, route queries, validation, dumps);
- ``perf``: the performance manager (PMA counters).

Below them all sit the small pieces every layer reads: ``lidmap`` (the LID map) and ``links``
(per-link MTU, VLs, rate). Imports point one way: ``fabric`` <- ``sm`` <- ``exporters`` <- ``ibfm``;
inside ``sm``, ``sweep`` uses ``routing``, ``analysis`` and ``transport``; ``analysis`` and
``routing`` never import ``sweep``; nothing here imports an exporter.
"""
