#!/usr/bin/env python3
"""What a broker keeps after a burst: 20 QoS 1 subscribers stall (4 KiB receive
buffers, no PUBACK) while one publisher sends 3,000 QoS 1 messages of 128 bytes,
then all of it is read and acknowledged. Prints the broker's RssAnon before, at
the peak and after the drain. Loopback only.

usage: burst_rss.py PID PORT
"""
import socket, sys, time
from mqtt_wire import pkt, s16 as s, connect as connect_to
pid, port = sys.argv[1], int(sys.argv[2])
def rss():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("RssAnon"): return int(l.split()[1])
def connect(cid): return connect_to(port, cid)
subs = []
for i in range(20):
    c = connect(b"burst-sub-%d" % i)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.sendall(pkt(0x82, b"\x00\x01" + s(b"burst/t") + b"\x01"))
    c.recv(5)
    subs.append(c)
time.sleep(0.3)
before = rss()
p = connect(b"burst-pub")
for n in range(3000):
    p.sendall(pkt(0x32, s(b"burst/t") + (n + 1).to_bytes(2, "big") + b"x" * 128))
time.sleep(1.0)
peak = rss()
# drain: read and PUBACK everything
for c in subs:
    c.settimeout(0.5)
buf = {c: b"" for c in subs}
end = time.time() + 20
got = 0
while time.time() < end and got < 20 * 3000:
    for c in subs:
        try: d = c.recv(65536)
        except socket.timeout: continue
        b = buf[c] + d; acks = b""
        while len(b) >= 2:
            ln, i, mul = 0, 1, 1
            while i < len(b):
                x = b[i]; ln += (x & 127) * mul; mul *= 128; i += 1
                if x < 128: break
            else:
                break
            if len(b) < i + ln: break
            if b[0] >> 4 == 3:
                got += 1
                if b[0] & 6:
                    tl = int.from_bytes(b[i:i+2], "big"); pid_ = b[i+2+tl:i+4+tl]
                    acks += b"\x40\x02" + pid_
            b = b[i+ln:]
        buf[c] = b
        if acks: c.sendall(acks)
time.sleep(1.0)
print(f"delivered {got}; RssAnon KiB before {before} peak {peak} after drain {rss()}")
