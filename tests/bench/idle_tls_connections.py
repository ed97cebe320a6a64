#!/usr/bin/env python3
"""Opens N idle MQTT 5 connections over TLS to a broker and prints the broker's RSS
growth: idle_connections.py's figure for a TLS door, to compare with a plain one.

usage: idle_tls_connections.py PID PORT CA_FILE [N] [--tls1.2]
"""
import socket, ssl, sys, time

from idle_connections import connect_packet, rss_kib

def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    pid, port, ca_file = int(args[0]), int(args[1]), args[2]
    n = int(args[3]) if len(args) > 3 else 1000
    context = ssl.create_default_context(cafile=ca_file)
    if "--tls1.2" in sys.argv:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    before = rss_kib(pid)
    socks = []
    for i in range(n):
        raw = socket.create_connection(("127.0.0.1", port))
        s = context.wrap_socket(raw, server_hostname="localhost")
        s.sendall(connect_packet(f"idle-tls-{i}"))
        ack = s.recv(64)
        assert ack[0] == 0x20 and ack[3] == 0, ack
        socks.append(s)
    time.sleep(1)
    after = rss_kib(pid)
    print(f"idle RSS before: {before} KiB; with {n} idle MQTT 5 clients over {socks[0].version()}: "
          f"{after} KiB; growth {after - before} KiB = {(after - before) * 1024 / n:.0f} bytes per connection")
    for s in socks:
        s.close()

if __name__ == "__main__":
    main()
