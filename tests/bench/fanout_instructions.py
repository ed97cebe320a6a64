#!/usr/bin/env python3
"""Drives one fan-out, one publish at a time, for a broker under callgrind.

usage: fanout_instructions.py PORT PUBLISHES [SUBSCRIBERS] [QOS]

SUBSCRIBERS (100) MQTT 3.1.1 clients subscribe to bench/fan at QOS (0); one
publisher sends PUBLISHES 128-byte messages at that QoS, each only after every
subscriber has the previous one (and, at QoS 1, the PUBACK is in): every publish
is a fan-out of its own, as in saguin-bench's paced phase, and the broker's work
for it does not depend on how fast the machine is. Subscribers acknowledge QoS 1
deliveries. Run it twice, with PUBLISHES 0 and N, under
`valgrind --tool=callgrind`: the difference in the broker's instruction count
divided by N * SUBSCRIBERS is its user-space instructions per delivery
(tests/bench/instructions does exactly that, for Sagüin and mosquitto).
Every wait has a timeout; only 127.0.0.1 is spoken to.
"""
import selectors
import sys
import time

import mqtt_wire
from mqtt_wire import pkt as packet, read_exact, s16 as string

TOPIC = b"bench/fan"
TIMEOUT_S = 120


def connect(port, client_id):
    return mqtt_wire.connect(port, client_id.encode(), TIMEOUT_S)


def read_packet(s):
    first = read_exact(s, 1)[0]
    length, shift = 0, 0
    while True:
        byte = read_exact(s, 1)[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return first, read_exact(s, length)


def main():
    port, publishes = int(sys.argv[1]), int(sys.argv[2])
    subscribers = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    qos = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    subs = []
    for i in range(subscribers):
        s = connect(port, f"fan-sub-{i:03}")
        s.sendall(packet(0x82, b"\x00\x01" + string(TOPIC) + bytes([qos])))
        first, body = read_packet(s)
        if first != 0x90 or body[2] != qos:
            raise SystemExit(f"subscriber {i}: SUBACK {first:#x} {body!r}")
        subs.append(s)
    publisher = connect(port, "fan-pub")
    sel = selectors.DefaultSelector()
    for s in subs:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, bytearray())
    payload = bytes(128)
    for n in range(publishes):
        packet_id = (n % 65535 + 1).to_bytes(2, "big")
        head = string(TOPIC) + (packet_id if qos else b"")
        publisher.sendall(packet(0x30 | qos << 1, head + payload))
        waiting = set(range(subscribers))
        deadline = time.monotonic() + TIMEOUT_S
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit(f"publish {n}: {len(waiting)} subscribers never got it")
            for key, _ in sel.select(left):
                buf = key.data
                buf += key.fileobj.recv(65536)
                # Whole packets only; each is one delivery of this publish.
                while len(buf) >= 2:
                    length, shift, i = 0, 0, 1
                    while i < len(buf) and buf[i] & 0x80:
                        length |= (buf[i] & 0x7F) << shift
                        shift, i = shift + 7, i + 1
                    if i >= len(buf):
                        break
                    length |= (buf[i] & 0x7F) << shift
                    end = i + 1 + length
                    if len(buf) < end:
                        break
                    body = bytes(buf[i + 1:end])
                    del buf[:end]
                    if qos:
                        pid = body[2 + len(TOPIC):4 + len(TOPIC)]
                        key.fileobj.sendall(packet(0x40, pid))
                    waiting.discard(subs.index(key.fileobj))
        if qos:
            first, body = read_packet(publisher)
            if first != 0x40 or body[:2] != packet_id:
                raise SystemExit(f"publish {n}: PUBACK {first:#x} {body!r}")
    for s in subs + [publisher]:
        s.setblocking(True)
        s.sendall(b"\xe0\x00")
        s.close()
    print(f"{publishes} publishes x {subscribers} subscribers at QoS {qos} delivered")


if __name__ == "__main__":
    main()
