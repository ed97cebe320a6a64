//! The shipped ARM binaries (built by `cross/build` into `target/dist/<triple>/saguin`)
//! are portable: static (no dynamic section, no NEEDED libraries), for the right
//! architecture, and within the flash budget. A pinned-glibc build (`<triple>.2.17`)
//! may link glibc dynamically but must need nothing newer than GLIBC_2.17.
//!
//! They carry mimalloc in place of musl's malloc (src/main.rs), and each serves MQTT
//! traffic of many message sizes under qemu-user.
//!
//! A target that has not been built is skipped with a message, so `cargo test` on a
//! machine that never cross-compiled passes; `.ci/arm` builds them first and sets
//! SAGUIN_REQUIRE_ARM_BINARIES=1 so that a missing one fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Broker, Raw};
use saguin::codec::{ProtocolVersion, QoS};

/// Budget from issue 8: under 6 MiB per ARM binary with everything in.
const MAX_BYTES: u64 = 6 * 1024 * 1024;

fn dist(triple: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/dist")
        .join(triple)
        .join("saguin")
}

fn tool(candidates: &[&str], args: &[&str], bin: &Path) -> Option<String> {
    for c in candidates {
        if let Ok(out) = Command::new(c).args(args).arg(bin).output()
            && out.status.success()
        {
            return Some(String::from_utf8_lossy(&out.stdout).into_owned());
        }
    }
    None
}

fn present(triple: &str) -> Option<PathBuf> {
    let p = dist(triple);
    if p.exists() {
        return Some(p);
    }
    // "1" requires every target; otherwise the variable lists the triples required.
    let required = std::env::var("SAGUIN_REQUIRE_ARM_BINARIES").unwrap_or_default();
    if required == "1" || required.split_whitespace().any(|t| t == triple) {
        panic!("{} is missing: run cross/build", p.display());
    }
    eprintln!("skipped: {} not built (cross/build {triple})", p.display());
    None
}

fn check_static(triple: &str, arch: &str, readelf: &[&str]) {
    let Some(bin) = present(triple) else { return };
    let size = std::fs::metadata(&bin).unwrap().len();
    let Some(file) = tool(&["file"], &["-b"], &bin) else {
        eprintln!("skipped: `file` is not installed");
        return;
    };
    eprintln!("{triple}: {size} bytes, {}", file.trim());
    assert!(
        file.contains(arch),
        "{triple}: not an {arch} binary: {file}"
    );
    assert!(
        file.contains("statically linked") || file.contains("static-pie linked"),
        "{triple}: not static: {file}"
    );
    assert!(
        size < MAX_BYTES,
        "{triple}: {size} bytes, over the {MAX_BYTES}-byte budget"
    );
    if let Some(dynamic) = tool(readelf, &["-d"], &bin) {
        assert!(
            !dynamic.contains("(NEEDED)"),
            "{triple}: needs shared libraries:\n{dynamic}"
        );
    }
}

/// One test payload: `len` bytes that differ with `seed`.
fn payload(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|b| (b + seed) as u8).collect()
}

/// The static binary carries mimalloc: its messages are in the binary (with the
/// `override` feature it serves C's `malloc` too, SQLite's). Run by `qemu`, the binary
/// carries QoS 0 and QoS 1 broadcast traffic of sizes from 1 byte to 20 KiB, every
/// delivery intact and in order, and replays records of such sizes from sqlite to a
/// new reader. Skipped where `qemu` is not installed.
fn check_serves_with_mimalloc(triple: &str, qemu: &str) {
    let Some(bin) = present(triple) else { return };
    let bytes = std::fs::read(&bin).expect("read the binary");
    assert!(
        bytes.windows(10).any(|w| w == b"mimalloc: "),
        "{triple}: mimalloc is not linked in; musl's malloc would serve every allocation"
    );
    if Command::new(qemu).arg("--version").output().is_err() {
        eprintln!("skipped: {qemu} is not installed");
        return;
    }
    // B-564: its licences are those of what it carries, mimalloc's among them.
    let licences = Command::new(qemu)
        .arg(&bin)
        .arg("--licenses")
        .output()
        .expect("qemu runs the binary");
    let licences = String::from_utf8_lossy(&licences.stdout);
    assert!(
        licences
            .lines()
            .any(|l| l.trim_start().starts_with("mimalloc ")),
        "{triple}: --licenses does not list mimalloc:\n{}",
        licences.chars().take(2000).collect::<String>()
    );
    // `bash -c WRAPPER saguin <test build> --config FILE`: run the shipped binary instead.
    let wrapper = format!("shift; exec {qemu} {} \"$@\"", bin.display());
    let broker = Broker::start_under(common::temp_dir("static"), common::CHANNELS, Some(&wrapper));
    let mut at_most_once = Raw::connected(broker.addr, ProtocolVersion::V5, "sub0");
    let mut at_least_once = Raw::connected(broker.addr, ProtocolVersion::V311, "sub1");
    let mut publisher = Raw::connected(broker.addr, ProtocolVersion::V5, "pub");
    for (sub, qos) in [
        (&mut at_most_once, QoS::AtMostOnce),
        (&mut at_least_once, QoS::AtLeastOnce),
    ] {
        assert_eq!(sub.subscribe("sizes/#", common::opts(qos)), [qos as u8]);
    }
    for i in 0..200usize {
        let payload = payload(i, 1 + i * 97 % 20_000);
        let topic = format!("sizes/{i}");
        assert_eq!(
            publisher.publish(&topic, &payload, QoS::AtLeastOnce, false),
            Some(0)
        );
        for sub in [&mut at_most_once, &mut at_least_once] {
            let got = sub.recv_publish();
            assert_eq!(
                (&*got.topic, got.payload.len()),
                (topic.as_str(), payload.len())
            );
            assert!(
                got.payload[..] == payload[..],
                "{triple}: message {i} changed on its way"
            );
        }
    }
    let records = 50usize;
    for i in 0..records {
        let record = payload(i, 1 + i * 397 % 20_000);
        assert_eq!(
            publisher.publish("events/x", &record, QoS::AtLeastOnce, false),
            Some(0),
            "{triple}: record {i} not stored"
        );
    }
    let mut reader = Raw::connected(broker.addr, ProtocolVersion::V5, "reader");
    assert_eq!(
        reader.subscribe("events/#", common::opts(QoS::AtLeastOnce)),
        [1]
    );
    for i in 0..records {
        let got = reader.recv_publish();
        assert!(
            got.payload[..] == payload(i, 1 + i * 397 % 20_000)[..],
            "{triple}: record {i} replayed changed or out of order"
        );
    }
}

/// Highest GLIBC_x.y version that `objdump -T` lists, as (x, y).
fn max_glibc(objdump_t: &str) -> Option<(u32, u32)> {
    objdump_t
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut it = v.split('.');
            Some((
                it.next()?.parse().ok()?,
                it.next().unwrap_or("0").parse().ok()?,
            ))
        })
        .max()
}

fn check_old_glibc(triple: &str, arch: &str, objdump: &[&str]) {
    let p = dist(triple);
    if !p.exists() {
        eprintln!("skipped: {} not built (optional)", p.display());
        return;
    }
    let Some(file) = tool(&["file"], &["-b"], &p) else {
        return;
    };
    assert!(file.contains(arch), "{triple}: {file}");
    let Some(syms) = tool(objdump, &["-T"], &p) else {
        eprintln!("skipped: no objdump for {triple}");
        return;
    };
    let max = max_glibc(&syms);
    eprintln!("{triple}: newest glibc symbol {max:?}");
    assert!(
        max.is_none_or(|v| v <= (2, 17)),
        "{triple}: needs glibc {max:?}, more than 2.17"
    );
}

#[test]
fn armv7_musl_is_static() {
    check_static(
        "armv7-unknown-linux-musleabihf",
        "ARM, EABI5",
        &["arm-linux-gnueabihf-readelf", "readelf"],
    );
}

#[test]
fn aarch64_musl_is_static() {
    check_static(
        "aarch64-unknown-linux-musl",
        "ARM aarch64",
        &["aarch64-linux-gnu-readelf", "readelf"],
    );
}

#[test]
fn armv7_musl_serves_with_mimalloc() {
    check_serves_with_mimalloc("armv7-unknown-linux-musleabihf", "qemu-arm");
}

#[test]
fn aarch64_musl_serves_with_mimalloc() {
    check_serves_with_mimalloc("aarch64-unknown-linux-musl", "qemu-aarch64");
}

#[test]
fn pinned_glibc_builds_need_at_most_2_17() {
    check_old_glibc(
        "armv7-unknown-linux-gnueabihf.2.17",
        "ARM, EABI5",
        &["arm-linux-gnueabihf-objdump"],
    );
    check_old_glibc(
        "aarch64-unknown-linux-gnu.2.17",
        "ARM aarch64",
        &["aarch64-linux-gnu-objdump"],
    );
}

#[test]
fn glibc_version_parsing() {
    let t = "00000000      DF *UND*  00000000 (GLIBC_2.4)   memcpy\n\
             00000000      DF *UND*  00000000  GLIBC_2.17  clock_gettime\n";
    assert_eq!(max_glibc(t), Some((2, 17)));
    assert_eq!(max_glibc("nothing"), None);
}

/// Under `cargo test --target armv7-unknown-linux-gnueabihf` this test binary runs in
/// qemu-arm, and the broker it spawns is an ARM binary too: qemu-user does not
/// intercept execve, so the kernel must know ARM binaries through binfmt_misc (.ci/arm
/// registers qemu-user-binfmt's entries). On the host this spawns the host binary.
/// It proves the integration tests' way of starting the broker works where they run.
#[test]
fn broker_binary_can_be_spawned_where_tests_run() {
    let bin = env!("CARGO_BIN_EXE_saguin");
    let out = Command::new(bin).arg("--help").output().unwrap_or_else(|e| {
        panic!(
            "cannot start {bin}: {e}. Emulated ({}): register qemu with binfmt_misc (see .ci/arm)",
            std::env::consts::ARCH
        )
    });
    // Without binfmt, glibc's posix_spawnp hands an ENOEXEC file to /bin/sh, which
    // fails on the ELF bytes: success is the only proof that the broker itself ran.
    assert!(
        out.status.success(),
        "{bin} --help: {:?}, stderr: {}. Emulated ({}): is qemu registered with binfmt_misc (see .ci/arm)?",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        std::env::consts::ARCH
    );
}
