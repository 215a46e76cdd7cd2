"""SM handover and takeover times over ibsim: OpenSM beside OpenSM, and ibfm beside OpenSM.

Run as ``python bench/election.py [--radix K]`` (ibsim, opensm and infiniband-diags installed).
Both SMs run with their defaults (OpenSM: 10 s SMInfo polling, 4 retries; ibfm: 2 s, 3 quick
retries). Four cases, each timed from the event to the moment the new master has the subnet up
(OpenSM: "SUBNET UP" in its log; ibfm: ``subnet_up`` in its /health):

1. a higher-priority SM joins a running master: OpenSM(0) + OpenSM(5), then ibfm(0) + OpenSM(5)
   and OpenSM(0) + ibfm(5);
2. the master is killed (-9) and the standby takes over: the same pairs.

Between two OpenSMs on ibsim a handover leaves the subnet with no master until the newcomer's
polls of the old master time out (about 60 s); the numbers show where ibfm does better.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fabric.generate import fattree  # noqa: E402
from fabric.model import Fabric  # noqa: E402
from tests.test_ibsim_election import IBFM_HOST, OSM_HOST, OpenSm, ibfm_serve, opensm  # noqa: E402
from tests.test_ibsim_sm import SIM_SPEED, start_sim  # noqa: E402

LIMIT_S = 120.0


def waited(cond: Callable[[], bool], limit: float = LIMIT_S) -> float | None:
    """Seconds until ``cond()`` holds, or None after ``limit``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit:
            return None
        time.sleep(0.05)
    return time.monotonic() - t0


def _osm_up(osm: OpenSm, after: int = 0) -> Callable[[], bool]:
    def up() -> bool:
        return osm.text().count("SUBNET UP") > after

    return up


def fmt(x: float | None) -> str:
    return f"never (>{LIMIT_S:.0f} s)" if x is None else f"{x:6.2f} s"


def run_case(first: str, second: str, fabric: Fabric) -> tuple[float | None, float | None]:
    """The first SM (priority 0) up; the second (priority 5) joins: seconds until it has the subnet up;
    it is killed: seconds until the first has it up again. None: not within LIMIT_S."""
    with tempfile.TemporaryDirectory() as tmp, start_sim(Path(tmp), fabric, IBFM_HOST) as sim, ExitStack() as es:
        if first == "ibfm":
            a = es.enter_context(ibfm_serve(sim, priority=0))

            def a_up() -> bool:
                return a.role() == "master" and a.health().get("subnet_up") is True
        else:
            # two OpenSMs need two ports; beside ibfm (at IBFM_HOST) OpenSM takes its own
            osm_a = es.enter_context(opensm(sim, priority=0, host=IBFM_HOST if second == "opensm" else OSM_HOST))
            a_up = _osm_up(osm_a)
        if waited(a_up, 60) is None:
            raise SystemExit(f"{first}: the first SM never came up")
        t0 = time.monotonic()
        if second == "ibfm":
            b = es.enter_context(ibfm_serve(sim, priority=5))
            join = waited(lambda: b.role() == "master" and b.health().get("subnet_up") is True)
            kill = b.proc
        else:
            osm_b = es.enter_context(opensm(sim, priority=5))
            join = waited(_osm_up(osm_b))
            kill = osm_b.proc  # type: ignore[assignment]
        join = None if join is None else time.monotonic() - t0
        kill.kill()
        t1 = time.monotonic()
        took = waited(a_up if first == "ibfm" else _osm_up(osm_a, osm_a.text().count("SUBNET UP")))
        return join, None if took is None else time.monotonic() - t1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--radix", type=int, default=8, help="2-level fat tree radix (default 8)")
    args = ap.parse_args()
    fabric = fattree(2, args.radix, speed=SIM_SPEED)
    rows = [(a, b, *run_case(a, b, fabric)) for a, b in (("opensm", "opensm"), ("ibfm", "opensm"), ("opensm", "ibfm"))]
    print(f"fat tree 2 levels radix {args.radix} on ibsim; first SM priority 0, second priority 5")
    print(f"{'first (0)':10} {'joining (5)':12} {'newcomer master, subnet up':>28} {'first SM back after kill -9':>30}")
    for first, second, join, took in rows:
        print(f"{first:10} {second:12} {fmt(join):>28} {fmt(took):>30}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
