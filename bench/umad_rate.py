"""SMPs per second through libibumad + ibsim (UmadTransport) for several window sizes.

Starts ibsim on net.2sw2path4hca2port, then runs the transport in a child process
with LD_PRELOAD=libumad2sim.so and prints NodeInfo Gets per second for each window
(DR paths of 0, 1 and 2 hops, in turn), once as concurrent ``send`` calls and once
as one ``send_many`` batch.

Run: .venv/bin/python bench/umad_rate.py [count-per-window] [windows, e.g. 1,4,16,64]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabric.ibsim import IbsimProcess, ibsim_available
from tests.umad_probe import NET_2SW2PATH4HCA2PORT, run_probe


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    windows = [int(w) for w in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 4, 16, 64]
    if not ibsim_available("ibsim"):
        sys.exit("ibsim or libumad2sim not installed")
    paths = [[], [1], [3], [3, 1]]
    with tempfile.TemporaryDirectory() as tmp, IbsimProcess(NET_2SW2PATH4HCA2PORT) as sim:
        res = run_probe(
            sim, Path(tmp), "rate", {"paths": paths, "count": count, "windows": windows}, timeout=600
        )
    print(f"UmadTransport via libumad2sim/ibsim, {count} NodeInfo Gets per window, DR paths {paths}")
    print(f"{'window':>8} {'send() SMPs/s':>14} {'send_many SMPs/s':>17} {'retries':>8}")
    for w in windows:
        r = res[str(w)]
        print(f"{w:>8} {r['rate']:>14.0f} {r['rate_many']:>17.0f} {r['retries']:>8}")

if __name__ == "__main__":
    main()
