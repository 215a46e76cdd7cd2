"""Transports: MAD bytes out along a route, MAD bytes back, and SMPs over them.

Owns the window of outstanding requests, TID matching, timeouts and retries (``base``), the
libibumad transport (``umad``), the in-process one over the emulated fabric (``emulated``),
and SMP Get/Set batches built and checked as arrays (``smp``). Imports ``fabric`` only.
"""
