#!/usr/bin/env python3
"""What a point read and a seek to a time cost as a channel grows. Against a
broker whose configuration holds a latest channel `state` (filter `state/#`) and
an append channel `log` (filter `log/#`): fills `state` with TOPICS values and
`log` with RECORDS records of 100 bytes, then times READS point reads
(`$saguin/kv/get`, MQTT 5, one at a time) and SEEKS seeks to the present time
(`$saguin/consumer/log/seek`). Loopback only.

usage: verbs.py PORT TOPICS RECORDS READS SEEKS
"""
import datetime, socket, sys, time
from mqtt_wire import enc_len, pkt, s16, read_packet


port, topics, records, reads, seeks = (int(a) for a in sys.argv[1:6])


def until_puback(c):
    """Reads up to a PUBACK, which must be 0x00; the packets before it, by type."""
    seen = []
    while True:
        first, body = read_packet(c)
        kind = first >> 4
        if kind == 4:
            assert len(body) <= 2 or body[2] == 0, f"PUBACK 0x{body[2]:02x}"
            return seen
        seen.append(kind)


c = socket.create_connection(("127.0.0.1", port), timeout=60)
c.sendall(pkt(0x10, s16(b"MQTT") + bytes([5, 0x02, 0, 60, 0]) + s16(b"verbs-bench")))
assert read_packet(c)[0] >> 4 == 2
c.sendall(pkt(0x82, b"\x00\x01\x00" + s16(b"bench/reply") + b"\x00"))
assert read_packet(c)[0] >> 4 == 9
# QoS 0 fills, then one QoS 1 publish: its PUBACK says every one before was read.
for start in range(0, max(topics, records), 1000):
    c.sendall(b"".join(pkt(0x30, s16(b"state/%d" % i) + b"\x00" + b"v%d" % i)
                       for i in range(start, min(start + 1000, topics))))
    c.sendall(b"".join(pkt(0x30, s16(b"log/x") + b"\x00" + b"y" * 100)
                       for _ in range(start, min(start + 1000, records))))
c.sendall(pkt(0x32, s16(b"log/x") + b"\x00\x02\x00" + b"z"))
until_puback(c)
time.sleep(1)  # the group commit behind the QoS 0 records
reply = b"\x08" + s16(b"bench/reply")
props = enc_len(len(reply)) + reply
t0 = time.monotonic()
for i in range(reads):
    key = b"state/%d" % ((i * 7919) % max(topics, 1))
    c.sendall(pkt(0x32, s16(b"$saguin/kv/get") + (10 + i % 60000).to_bytes(2, "big") + props + key))
    seen = until_puback(c)
    if 3 not in seen:
        assert read_packet(c)[0] >> 4 == 3
dt = time.monotonic() - t0
if reads:
    print(f"{reads} point reads over {topics} topics: {dt:.3f} s, {reads / dt:.0f} a second")
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ").encode()
t0 = time.monotonic()
for i in range(seeks):
    c.sendall(pkt(0x32, s16(b"$saguin/consumer/log/seek") + (10 + i).to_bytes(2, "big") + b"\x00" + now))
    until_puback(c)
dt = time.monotonic() - t0
if seeks:
    print(f"{seeks} seeks by time over {records} records: {dt:.3f} s, {dt / seeks * 1000:.1f} ms each")
