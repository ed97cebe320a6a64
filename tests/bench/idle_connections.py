#!/usr/bin/env python3
"""Opens N idle MQTT 5 connections to a broker and prints the broker's RSS growth.

usage: idle_connections.py PID PORT [N]
"""
import socket, sys, time

def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise SystemExit("no VmRSS")

def connect_packet(client_id):
    cid = client_id.encode()
    body = b"\x00\x04MQTT\x05\x02\x00\x3c\x00" + len(cid).to_bytes(2, "big") + cid
    return b"\x10" + bytes([len(body)]) + body

def main():
    pid, port = int(sys.argv[1]), int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    before = rss_kib(pid)
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(connect_packet(f"idle-{i}"))
        ack = s.recv(64)
        assert ack[0] == 0x20 and ack[3] == 0, ack
        socks.append(s)
    time.sleep(1)
    after = rss_kib(pid)
    print(f"idle RSS before: {before} KiB; with {n} idle MQTT 5 clients: {after} KiB; "
          f"growth {after - before} KiB = {(after - before) * 1024 / n:.0f} bytes per connection")
    for s in socks:
        s.close()

if __name__ == "__main__":
    main()
