"""The HTTP API (aiohttp): topology, routes, LFTs, partitions, health, validation, congestion, what-if, sweeps.

:func:`~exporters.http.app.create_app` builds the application around a source of subnet
snapshots (the :class:`~sm.sweep.manager.FabricManager`). Everything lives under
``/api/v1``; ``/api/v1/openapi.json`` describes every endpoint
(:mod:`exporters.http.openapi`), and ``/metrics`` is mounted when a Prometheus
renderer is given.

Handlers read the current snapshot and never wait on a sweep: before the
first heavy sweep they answer 503. Per-snapshot lookup tables (endpoint
resolution, node and port lists, switch rows) are built once per snapshot
in a :class:`~exporters.http.view.SnapshotView` and dropped when the next snapshot arrives; the
answers of expensive questions (validation, congestion, a what-if's
baseline) are kept there too. Heavy work runs in a worker thread on the
immutable snapshot.

Reads are open. Writes (``POST /api/v1/sweep``, ``POST /api/v1/partitions/reload``) need ``Authorization:
Bearer <token>``; without a configured token they are refused. Every error
is JSON ``{"error", "detail", "parameter"}`` (a partitions file that does not
parse adds ``file``, ``line``, ``column`` and ``message``); unexpected exceptions become
a 500 of the same shape (and are logged), but no input is meant to reach it.
A request aiohttp cannot parse (a line over 8,190 bytes, bytes that are not
HTTP) never reaches a handler: aiohttp answers it with its own plain-text
400, and :data:`~exporters.http.common.SERVER_LOG` makes that one log line instead of a traceback.

One module per resource, each with its ``RouteTableDef``: ``topology``
(nodes, ports, links), ``routes`` (routes, LFTs), ``partitions`` (partitions,
their members, the reload SIGHUP shares), ``health`` (health,
validation), ``congestion`` (congestion, what-if), ``sweep`` (sweep
requests, events); ``view`` (the per-snapshot tables), ``state`` (the
app's mutable state), ``common`` (keys, errors, request parsing,
middleware), ``openapi`` (schemas and the document) and ``app``
(``create_app``, which wires them).
"""
