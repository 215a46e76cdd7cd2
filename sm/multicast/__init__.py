"""Multicast forwarding: one spanning tree per MLID and the switches' multicast forwarding tables.

As OpenSM's ``osm_mcast_mgr.c``, a group's tree is thrown away and rebuilt whole when its members
change; nothing is patched in place.

- ``tree``: the hop table shared by every group of a topology (``hop_table``), the root switch
  and the tree of one group (``build_tree`` -> ``McastTree``: per switch the bitmask of ports a
  packet leaves by), and a checker that floods a packet through per-switch masks however they
  were made (``flood``, ``verify_tree``).
- ``mft``: MulticastForwardingTable blocks (32 MLIDs x 16 ports per block and position), the
  blocks a switch needs, their 64-byte payloads, and MLID allocation (``MlidPool``).

May import ``fabric``, ``sm.lidmap`` and ``sm.routing`` (the LFT type and its hop machinery);
never the sweep, the SA or an exporter. The SA decides who is a member; the sweep sends the
blocks.
"""
