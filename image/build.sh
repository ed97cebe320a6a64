#!/usr/bin/env bash
# image/build.sh <board> [--bin PATH] [--base DIR|TARBALL | --debootstrap SUITE] [--out DIR] [--size MiB]
#
# Builds, without root and without network beyond the package registries:
#   <out>/rootfs/          the root filesystem tree
#   <out>/saguin-<board>.ext4   an ext4 image of it (mke2fs -d, no mount)
#   <out>/MANIFEST.txt      every path with its mode, owner and size
# for the board described by boards/<board>.toml. The tree holds
#   /usr/bin/saguin                          the board's static binary (cross/build --board)
#   /etc/saguin/saguin.yaml                  gateway configuration from image/files/saguin.yaml.in
#   /etc/saguin/clients.passwd               empty mosquitto-format password file
#   /usr/lib/systemd/system/saguin.service   systemd unit (ExecStartPre --check-config, SIGUSR1 reload)
#   /etc/init.d/saguin                       the same for sysvinit / BusyBox init
#   /usr/lib/sysusers.d/saguin.conf, /etc/logrotate.d/saguin
#   /var/lib/saguin (+ snapshots/)           state, owned by saguin (uid/gid 990)
# By default the tree is an overlay to merge into the board vendor's root
# filesystem (or to flash as its own partition). --base seeds the tree first from
# an existing root filesystem (a directory or a tarball, e.g. the vendor's image or
# a `debootstrap --foreign` tree) and then also adds the saguin account to its
# /etc/passwd and /etc/group if it has them. --debootstrap SUITE (e.g. bookworm)
# seeds it with the first stage of `debootstrap --foreign --variant=minbase` for the
# board's Debian architecture from $DEBIAN_MIRROR (default deb.debian.org; ~20 s,
# ~180 MB; plus $DEBOOTSTRAP_INCLUDE, default systemd-sysv, for an init): the packages are unpacked but not configured, so the tree is completed
# on first boot on the board (or in qemu-system) by
# `/debootstrap/debootstrap --second-stage`; no emulated chroot runs here.
#
# Ownership: when not run as root the script re-runs itself under fakeroot, so the
# ext4 image records root:root and saguin:saguin exactly as a root build would.
# Default <out>: target/image/<board>. Default --bin: build it with cross/build.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
cd "$ROOT"

if [ "$(id -u)" != 0 ] && [ -z "${FAKEROOTKEY:-}" ]; then
  command -v fakeroot >/dev/null || { echo "image/build.sh: needs root or fakeroot (apt-get install fakeroot)" >&2; exit 2; }
  # Build the binary outside fakeroot (cargo under fakeroot is slow), then re-enter.
  exec fakeroot -- "$0" "$@"
fi

BOARD=${1:-}
[ -n "$BOARD" ] && [ "${BOARD#-}" = "$BOARD" ] || { sed -n '2,27p' "$0"; exit 2; }
shift
BIN= BASE= OUT= SIZE_MIB= SUITE=
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    --debootstrap) SUITE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --size) SIZE_MIB=$2; shift 2 ;;
    *) echo "image/build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
BOARD_FILE=boards/$BOARD.toml
[ -f "$BOARD_FILE" ] || { echo "image/build.sh: no board file $BOARD_FILE (have: $(ls boards/*.toml | xargs -n1 basename | sed 's/.toml$//' | xargs))" >&2; exit 2; }
OUT=${OUT:-target/image/$BOARD}
SAGUIN_UID=990 SAGUIN_GID=990

board() { python3 -c 'import sys,tomllib; d=tomllib.load(open(sys.argv[1],"rb")); print(d[sys.argv[2]])' "$BOARD_FILE" "$1"; }
TARGET=$(board target)

if [ -z "$BIN" ]; then
  # cargo must not run under fakeroot's LD_PRELOAD: drop it for the build.
  env -u LD_PRELOAD -u FAKEROOTKEY cross/build --board "$BOARD"
  BIN=target/dist/$TARGET/saguin
fi
[ -f "$BIN" ] || { echo "image/build.sh: no binary at $BIN" >&2; exit 1; }

TREE=$OUT/rootfs
rm -rf "$TREE"
mkdir -p "$TREE"
if [ -n "$BASE" ]; then
  if [ -d "$BASE" ]; then cp -a "$BASE/." "$TREE/"; else tar -xf "$BASE" -C "$TREE"; fi
elif [ -n "$SUITE" ]; then
  command -v debootstrap >/dev/null || PATH=$PATH:/usr/sbin
  timeout "${DEBOOTSTRAP_TIMEOUT:-600}" debootstrap --foreign --variant=minbase \
    --include="${DEBOOTSTRAP_INCLUDE:-systemd-sysv}" \
    --arch="$(board debian_arch)" "$SUITE" "$TREE" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$OUT/debootstrap.log" 2>&1 ||
    { tail -20 "$OUT/debootstrap.log"; echo "image/build.sh: debootstrap failed" >&2; exit 1; }
  rm -rf "$TREE/var/cache/apt/archives/"*.deb
fi

# Directories: create each level with an explicit mode (a merged-/usr base keeps its symlinks).
d() { local mode=$1 owner=$2; shift 2; for p in "$@"; do mkdir -p "$TREE$p"; chmod "$mode" "$TREE$p"; chown "$owner" "$TREE$p"; done; }
d 0755 0:0 /usr /usr/bin /usr/lib /usr/lib/systemd /usr/lib/systemd/system /usr/lib/sysusers.d \
           /etc /etc/init.d /etc/logrotate.d /var /var/lib /var/log
d 0750 0:$SAGUIN_GID /etc/saguin
d 0750 $SAGUIN_UID:$SAGUIN_GID /var/lib/saguin /var/lib/saguin/snapshots

f() { local mode=$1 owner=$2 src=$3 dst=$4; install -m "$mode" "$src" "$TREE$dst"; chown "$owner" "$TREE$dst"; }
f 0755 0:0 "$BIN" /usr/bin/saguin
python3 - "$BOARD_FILE" "$HERE/files/saguin.yaml.in" "$OUT/saguin.yaml" <<'PY'
import sys, tomllib, re
b = tomllib.load(open(sys.argv[1], "rb"))
vals = {k: v for k, v in b.items() if not isinstance(v, dict)}
vals.update(b["saguin"])
text = open(sys.argv[2]).read()
def sub(m):
    k = m.group(1)
    if k not in vals:
        sys.exit(f"image/build.sh: {sys.argv[1]} has no value for @{k}@")
    return str(vals[k])
open(sys.argv[3], "w").write(re.sub(r"@([a-z_]+)@", sub, text))
PY
f 0640 0:$SAGUIN_GID "$OUT/saguin.yaml" /etc/saguin/saguin.yaml
: > "$OUT/clients.passwd"
f 0640 0:$SAGUIN_GID "$OUT/clients.passwd" /etc/saguin/clients.passwd
f 0644 0:0 "$HERE/files/saguin.service" /usr/lib/systemd/system/saguin.service
f 0755 0:0 "$HERE/files/saguin.init" /etc/init.d/saguin
f 0644 0:0 "$HERE/files/saguin.sysusers" /usr/lib/sysusers.d/saguin.conf
f 0644 0:0 "$HERE/files/saguin.logrotate" /etc/logrotate.d/saguin

# A base root filesystem gets the account itself (an overlay leaves that to sysusers / the init script).
if [ -f "$TREE/etc/passwd" ] && ! grep -q '^saguin:' "$TREE/etc/passwd"; then
  echo "saguin:x:$SAGUIN_UID:$SAGUIN_GID:Sagüin MQTT broker:/var/lib/saguin:/usr/sbin/nologin" >> "$TREE/etc/passwd"
  [ -f "$TREE/etc/group" ] && echo "saguin:x:$SAGUIN_GID:" >> "$TREE/etc/group"
  [ -f "$TREE/etc/shadow" ] && echo "saguin:!:1::::::" >> "$TREE/etc/shadow"
fi
if [ -d "$TREE/etc/systemd/system" ]; then   # enable on a systemd base, as `systemctl enable` would
  mkdir -p "$TREE/etc/systemd/system/multi-user.target.wants"
  ln -sf /usr/lib/systemd/system/saguin.service "$TREE/etc/systemd/system/multi-user.target.wants/saguin.service"
fi

# Manifest and image.
(cd "$TREE" && find . -path ./proc -prune -o -printf '%M %U:%G %10s %p\n' | sort -k4) > "$OUT/MANIFEST.txt"
used_kib=$(du -sk "$TREE" | cut -f1)
[ -n "$SIZE_MIB" ] || SIZE_MIB=$(( (used_kib * 13 / 10 + 4096) / 1024 + 8 ))
IMG=$OUT/saguin-$BOARD.ext4
rm -f "$IMG"
mke2fs -q -F -t ext4 -L saguin -d "$TREE" -E root_owner=0:0 "$IMG" "${SIZE_MIB}M"
echo "image/build.sh: $BOARD ($TARGET): tree $TREE ($used_kib KiB), image $IMG (${SIZE_MIB} MiB), binary $(stat -c %s "$TREE/usr/bin/saguin") bytes"
