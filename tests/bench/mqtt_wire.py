"""MQTT 3.1.1 packets on a raw socket, for the bench's Python scripts: just what
they send, so a broker's cost is measured and not a client library's."""
import socket


def enc_len(n):
    """The Remaining Length encoding of `n`."""
    out = b""
    while True:
        b = n % 128
        n //= 128
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def pkt(first_byte, body):
    """A packet: its first byte, the Remaining Length, `body`."""
    return bytes([first_byte]) + enc_len(len(body)) + body


def s16(x):
    """A length-prefixed string."""
    return len(x).to_bytes(2, "big") + x


def read_exact(c, n):
    """Exactly `n` bytes from `c`."""
    b = b""
    while len(b) < n:
        more = c.recv(n - len(b))
        if not more:
            raise ConnectionError("closed")
        b += more
    return b


def read_packet(c):
    """The next packet from `c`: its first byte and its body."""
    first = read_exact(c, 1)[0]
    n, mult = 0, 1
    while True:
        b = read_exact(c, 1)[0]
        n += (b & 127) * mult
        mult *= 128
        if not b & 128:
            return first, read_exact(c, n)


def connect(port, cid, timeout=None):
    """A clean 3.1.1 session for `cid` on 127.0.0.1:`port`, accepted; every wait on
    the socket then up to `timeout` seconds (None: no limit)."""
    c = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.sendall(pkt(0x10, s16(b"MQTT") + b"\x04\x02\x00\x3c" + s16(cid)))
    ack = read_exact(c, 4)
    if ack[:2] != b"\x20\x02" or ack[3] != 0:
        raise ConnectionError(f"{cid!r}: CONNACK {ack!r}")
    return c
