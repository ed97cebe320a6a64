#!/usr/bin/env python3
"""How fast an out rule drains an append channel across a bridge. Against two
brokers on loopback: the edge, at EDGE_PORT, whose append channel `events`
(filter `events/#`) an out rule sends to the hub as `site/events/$#`; and the
hub, at HUB_PORT. Subscribes to `site/#` on the hub (QoS 1, each PUBACKed),
publishes N records of 128 bytes at QoS 0 to the edge over 100 topics, and
prints how long until the hub's subscriber had them all. Loopback only.

usage: bridge_drain.py HUB_PORT EDGE_PORT N
"""
import sys, threading, time
from mqtt_wire import pkt, s16, read_exact, read_packet, connect

hub_port, edge_port, n = (int(a) for a in sys.argv[1:4])
sub = connect(hub_port, b"far-reader", timeout=60)
sub.sendall(pkt(0x82, b"\x00\x01" + s16(b"site/#") + b"\x01"))
read_exact(sub, 5)
got = 0


def count():
    """Reads PUBLISHes until `n`, acknowledging each at QoS 1."""
    global got
    while got < n:
        first, body = read_packet(sub)
        if first >> 4 == 3:
            got += 1
            if (first >> 1) & 3:
                topic_len = int.from_bytes(body[:2], "big")
                sub.sendall(b"\x40\x02" + body[2 + topic_len:4 + topic_len])


reader = threading.Thread(target=count)
reader.start()
pub = connect(edge_port, b"edge-publisher", timeout=60)
t0 = time.monotonic()
for start in range(0, n, 1000):
    pub.sendall(b"".join(pkt(0x30, s16(b"events/%d" % (i % 100)) + b"x" * 128)
                         for i in range(start, min(n, start + 1000))))
reader.join(120)
dt = time.monotonic() - t0
print(f"{got} of {n} records across the bridge in {dt:.2f} s: {got / dt:.0f} a second")
