#!/usr/bin/env python3
"""Net-file figures at the design scale: write and read a 3-level fat-tree of 36-port switches.

    python bench/bench_netfile.py [--radix K] [--ibsim]

Prints seconds for format/parse in both styles, file size and line count.
With --ibsim, also starts ibsim on the written file (table limits raised)
and times ibnetdiscover against it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabric.formats.netfile import format_net, parse_net, read_net, write_net
from fabric.generate import fattree
from fabric.ibsim import IbsimProcess, ibsim_size_args
from fabric.model import Fabric


def _links_by_guid(f: Fabric) -> set[frozenset[tuple[int, int]]]:
    g = f.node_guid.tolist()
    return {frozenset({(g[a], p), (g[b], q)}) for a, p, b, q in f.link_array().tolist()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--radix", type=int, default=36)
    ap.add_argument("--ibsim", action="store_true", help="also run ibsim + ibnetdiscover on the file")
    args = ap.parse_args()
    t = time.perf_counter()
    f = fattree(3, args.radix)
    s = f.summary()
    print(f"generate fattree(3, {args.radix}): {time.perf_counter() - t:.2f} s  {s}")
    for style in ("ibsim", "ibnetdiscover"):
        t = time.perf_counter()
        text = format_net(f, style)  # type: ignore[arg-type]
        t_fmt = time.perf_counter() - t
        t = time.perf_counter()
        g = parse_net(text, style)
        t_parse = time.perf_counter() - t
        assert g.summary() == s
        assert _links_by_guid(g) == _links_by_guid(f)
        print(
            f"{style:14s} format {t_fmt:.2f} s, parse {t_parse:.2f} s, "
            f"{len(text) / 1e6:.1f} MB, {text.count(chr(10))} lines"
        )
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ft.net"
        t = time.perf_counter()
        write_net(f, path)
        t_w = time.perf_counter() - t
        t = time.perf_counter()
        read_net(path)
        print(f"write_net {t_w:.2f} s, read_net {time.perf_counter() - t:.2f} s")
        if args.ibsim:
            n_ports = int(f.nports.sum()) + int(f.switches.size)
            extra = ibsim_size_args(f.n_nodes, int(f.switches.size), n_ports)
            t = time.perf_counter()
            with IbsimProcess(path, extra_args=extra, start_timeout=600) as sim:
                print(f"ibsim {' '.join(extra)} started in {time.perf_counter() - t:.1f} s")
                t = time.perf_counter()
                out = sim.run(["ibnetdiscover"], timeout=3600).stdout
                print(f"ibnetdiscover {time.perf_counter() - t:.1f} s")
            seen = parse_net(out, "ibnetdiscover")
            same = _links_by_guid(seen) == _links_by_guid(f)
            print(f"ibnetdiscover saw {seen.summary()}; same links by GUID and port: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
