"""How fast QoS 0 broadcasts go past a subscriber stuck at QoS 2.

    python3 tests/bench/stuck_qos2.py SAGUIN_BIN PORT

The subscriber subscribes at QoS 2 and never reads again. 150,000 small QoS 2
publishes fill its socket and then its queue (limits.session_queue_bytes, 1 MiB),
with deliveries the broker may never give up. Then 200,000 QoS 0 publishes to the
same topics are timed, up to a PINGRESP behind them: each finds nothing to give
up and is refused at the bound (B-086). Not part of the test command.
"""
import struct, subprocess, sys, time, tempfile

from mqtt_wire import connect as connect_to, pkt, read_exact, s16

if len(sys.argv) != 3:
    sys.exit(__doc__)
bin_, port = sys.argv[1], int(sys.argv[2])
d = tempfile.mkdtemp()
open(f"{d}/s.yaml", "w").write(f"""broker:
  id: scan
  log_level: warn
  mqtt:
    listen:
      tcp:
        address: 127.0.0.1:{port}
    allow_anonymous: true
  limits:
    write_timeout: none
    max_connect_rate: none
  storage:
    default: m
    default_retention_period: none
    default_retention_bytes: none
    providers:
      m:
        type: memory
        snapshot_dir: none
""")
broker = subprocess.Popen([bin_, "--config", f"{d}/s.yaml"], stderr=subprocess.DEVNULL)


def connect(cid):
    return connect_to(port, cid.encode())


for _ in range(100):  # until it listens, at most 10 s
    try:
        connect("probe").close()
        break
    except ConnectionRefusedError:
        time.sleep(0.1)

stuck = connect("stuck")
stuck.sendall(pkt(0x82, b"\x00\x01" + s16(b"flood/#") + b"\x02"))
assert read_exact(stuck, 5)[0] == 0x90
pub = connect("pub")
def qos2(topic, payload, pid):
    pub.sendall(pkt(0x34, s16(topic) + struct.pack(">H", pid) + payload))
    assert read_exact(pub, 4)[0] == 0x50
    pub.sendall(pkt(0x62, struct.pack(">H", pid)))
    assert read_exact(pub, 4)[0] == 0x70

for i in range(150000): qos2(b"flood/small", b"y" * 64, i % 60000 + 1)
N = 200000
msg = pkt(0x30, s16(b"flood/q0") + b"z" * 64)
t0 = time.perf_counter()
batch = msg * 100
for _ in range(N // 100): pub.sendall(batch)
pub.sendall(b"\xc0\x00")
assert read_exact(pub, 2) == b"\xd0\x00"
dt = time.perf_counter() - t0
print(f"{N / dt:.0f} QoS 0 publishes/s past a stuck QoS 2 subscriber")
broker.kill()
