#!/usr/bin/env bash
# image/test.sh <board> [<out>]: inspect what image/build.sh produced, without mounting.
#  - every shipped path is in the ext4 image with its type, mode and owner (debugfs);
#  - the binary in the image is byte-identical to the tree's and is a static ARM ELF
#    for the board's architecture;
#  - the binary from the tree runs under qemu-user with --check-config against the
#    shipped /etc/saguin/saguin.yaml (qemu -L <tree> makes absolute paths resolve
#    inside the tree, so the configuration's /etc/saguin/... paths are the image's).
set -euo pipefail
cd "$(dirname "$0")/.."
BOARD=${1:?usage: image/test.sh <board> [out-dir]}
OUT=${2:-target/image/$BOARD}
IMG=$OUT/saguin-$BOARD.ext4
TREE=$OUT/rootfs
[ -f "$IMG" ] || { echo "no image $IMG: run image/build.sh $BOARD" >&2; exit 1; }
board() { python3 -c 'import sys,tomllib; d=tomllib.load(open(sys.argv[1],"rb")); print(d[sys.argv[2]])' "boards/$BOARD.toml" "$1"; }
ARCH=$(board arch); QEMU=$(board qemu_user)
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

fsck_out=$(e2fsck -fn "$IMG" 2>&1) && ok "e2fsck clean" || bad "e2fsck: $fsck_out"

# path type mode uid gid
while read -r path type mode uid gid; do
  st=$(debugfs -R "stat $path" "$IMG" 2>/dev/null) || true
  if [ -z "$st" ] || ! grep -q '^Inode:' <<<"$st"; then bad "$path missing from image"; continue; fi
  got_type=$(sed -n 's/.*Type: \([a-z]*\).*/\1/p' <<<"$st" | head -1)
  got_mode=$(sed -n 's/.*Mode: *\([0-7]*\).*/\1/p' <<<"$st" | head -1)
  got_uid=$(sed -n 's/^User: *\([0-9]*\).*/\1/p' <<<"$st" | head -1)
  got_gid=$(sed -n 's/.*Group: *\([0-9]*\).*/\1/p' <<<"$st" | head -1)
  want="$type $mode $uid:$gid"; got="$got_type $got_mode $got_uid:$got_gid"
  [ "$want" = "$got" ] && ok "$path $got" || bad "$path: want $want, got $got"
done <<'LIST'
/usr/bin/saguin regular 0755 0 0
/etc/saguin directory 0750 0 990
/etc/saguin/saguin.yaml regular 0640 0 990
/etc/saguin/clients.passwd regular 0640 0 990
/usr/lib/systemd/system/saguin.service regular 0644 0 0
/etc/init.d/saguin regular 0755 0 0
/usr/lib/sysusers.d/saguin.conf regular 0644 0 0
/etc/logrotate.d/saguin regular 0644 0 0
/var/lib/saguin directory 0750 990 990
/var/lib/saguin/snapshots directory 0750 990 990
LIST

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
debugfs -R "dump /usr/bin/saguin $tmp/saguin" "$IMG" >/dev/null 2>&1
cmp -s "$tmp/saguin" "$TREE/usr/bin/saguin" && ok "image binary identical to tree binary" || bad "image binary differs from tree"
debugfs -R "dump /usr/lib/systemd/system/saguin.service $tmp/unit" "$IMG" >/dev/null 2>&1
for want in 'ExecStartPre=/usr/bin/saguin --check-config /etc/saguin/saguin.yaml' \
            'ExecReload=/bin/kill -USR1 $MAINPID' 'Restart=on-failure' 'StateDirectory=saguin'; do
  grep -qxF "$want" "$tmp/unit" && ok "unit: $want" || bad "unit lacks: $want"
done
debugfs -R "dump /etc/init.d/saguin $tmp/init" "$IMG" >/dev/null 2>&1
sh -n "$tmp/init" && grep -q -- '--check-config' "$tmp/init" && grep -q 'kill -USR1' "$tmp/init" \
  && ok "init script: parses, checks config, reloads with SIGUSR1" || bad "init script"
debugfs -R "dump /etc/saguin/saguin.yaml $tmp/cfg" "$IMG" >/dev/null 2>&1
python3 - "$tmp/cfg" <<'PY' && ok "saguin.yaml: sqlite under /var/lib/saguin, operations on a unix socket" || bad "saguin.yaml content"
import sys, re
t = open(sys.argv[1]).read()
assert re.search(r"type: sqlite\n\s+file_path: /var/lib/saguin/", t), "sqlite provider"
assert re.search(r"operations:\n\s+listen:\n(\s+#.*\n)*\s+unix:\n\s+path: /run/saguin/operations.sock", t), "ops unix"
assert "@" not in re.sub(r"#.*", "", t), "unsubstituted placeholder"
PY

desc=$(file -b "$TREE/usr/bin/saguin")
case "$ARCH" in armv7) arch_re='ARM, EABI5' ;; aarch64) arch_re='ARM aarch64' ;; esac
grep -q "$arch_re" <<<"$desc" && grep -q 'statically linked' <<<"$desc" \
  && ok "binary: $desc" || bad "binary is not a static $ARCH ELF: $desc"

# --check-config under qemu-user, with the tree as the root for absolute paths.
set +e
out=$(timeout 60 "$QEMU" -L "$TREE" "$TREE/usr/bin/saguin" --check-config /etc/saguin/saguin.yaml 2>&1); rc=$?
set -e
[ $rc = 0 ] && ok "$QEMU saguin --check-config /etc/saguin/saguin.yaml (exit 0): ${out:0:200}" \
  || bad "--check-config refused the shipped configuration (exit $rc): $out"
# Until the CLI exists (src/main.rs empty) every invocation exits 0; once --check-config
# is real, a missing file must be refused, which proves the positive check above means something.
set +e
timeout 60 "$QEMU" -L "$TREE" "$TREE/usr/bin/saguin" --check-config /etc/saguin/absent.yaml >/dev/null 2>&1; neg=$?
set -e
if [ $neg != 0 ]; then ok "--check-config refuses a missing file (exit $neg)"
else echo "SKIP --check-config accepted a missing file: the broker's CLI is not implemented yet (src/main.rs), so the check above is vacuous"
  [ "${SAGUIN_REQUIRE_CLI:-1}" = 1 ] && fail=1
fi
exit $fail
