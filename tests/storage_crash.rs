//! Stored before acknowledged, proven by killing the writer: a child process publishes
//! with 32 concurrent publishers and prints each offset once its append completed; the
//! parent SIGKILLs it mid-stream, reopens the file, and finds every acknowledged record,
//! with no offset handed out again (B-151, invariant 9, B-522).

mod storage_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use saguin::storage::{ChannelSettings, SqliteProvider, SqliteSettings, WindowRequest};
use storage_support::{join_all, rec, temp_dir};

fn settings(path: &std::path::Path) -> SqliteSettings {
    SqliteSettings::new("local", path, 256 << 20, 1 << 20)
}

#[test]
fn every_acknowledged_record_survives_sigkill_and_no_offset_is_reused() {
    let dir = temp_dir("crash");
    let db = dir.join("saguin.db");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "crash_publisher", "--nocapture"])
        .env("SAGUIN_CRASH_DB", &db)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acked = Vec::new();
    while acked.len() < 3000 {
        let Some(Ok(line)) = lines.next() else { break };
        if let Some(off) = line.strip_prefix("ACK ") {
            acked.push(off.parse::<u64>().unwrap());
        }
    }
    child.kill().unwrap(); // SIGKILL
    // Acknowledgements already written to the pipe before the kill count too.
    for line in lines.map_while(Result::ok) {
        if let Some(off) = line.strip_prefix("ACK ") {
            acked.push(off.parse::<u64>().unwrap());
        }
    }
    child.wait().unwrap();
    assert!(
        acked.len() >= 3000,
        "the child acknowledged only {}",
        acked.len()
    );

    // The lock went with the killed process: the file opens again at once.
    let p = SqliteProvider::open(&settings(&db)).unwrap();
    smol::block_on(async {
        p.open_channel("events", ChannelSettings::append())
            .await
            .unwrap();
        let mut stored = std::collections::BTreeSet::new();
        let mut from = 0;
        loop {
            let w = p
                .read_window("events", WindowRequest::new(from, 1024, u64::MAX))
                .await
                .unwrap();
            let Some(last) = w.records.last() else { break };
            from = last.offset + 1;
            stored.extend(w.records.iter().map(|r| r.offset));
        }
        let missing: Vec<_> = acked.iter().filter(|o| !stored.contains(o)).collect();
        assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
        let max_acked = acked.iter().max().copied().unwrap_or(0);
        let next = p.append("events", rec("e/x", b"after", 0)).await.unwrap();
        assert!(next > max_acked, "offset {next} handed out again");
        assert!(!stored.contains(&next));
        println!(
            "{} acknowledged, {} stored, next offset {next}",
            acked.len(),
            stored.len()
        );
    });
}

/// The child: publishes until killed, printing each offset after its append completed.
#[test]
#[ignore = "helper run in a child process by another test"]
fn crash_publisher() {
    let Ok(db) = std::env::var("SAGUIN_CRASH_DB") else {
        return;
    };
    let p = SqliteProvider::open(&settings(std::path::Path::new(&db))).unwrap();
    smol::block_on(async {
        p.open_channel("events", ChannelSettings::append())
            .await
            .unwrap();
        let publishers: Vec<_> = (0..32)
            .map(|n| {
                let p = &p;
                async move {
                    for i in 0u64.. {
                        let off = p
                            .append("events", rec("e/x", &[n as u8; 64], i))
                            .await
                            .unwrap();
                        use std::io::Write;
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "ACK {off}").unwrap();
                        out.flush().unwrap();
                    }
                }
            })
            .collect();
        join_all(publishers).await;
    });
}

/// A failing write answers 0x83 and the provider keeps serving (issue 4 "Faults"): the
/// child runs with a file-size limit (`prlimit --fsize`, SIGXFSZ ignored), so the disk
/// refuses to grow the log part-way through.
#[test]
fn a_failing_disk_answers_0x83_and_the_provider_keeps_serving() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        eprintln!("prlimit not installed; skipped");
        return;
    }
    let dir = temp_dir("diskfull");
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("bash")
        .args([
            "-c",
            r#"trap "" XFSZ; exec prlimit --fsize=3000000 "$0" --ignored --exact disk_full_publisher --nocapture"#,
        ])
        .arg(&exe)
        .env("SAGUIN_DISKFULL_DB", dir.join("saguin.db"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ERR 131"), "{stdout}");
    assert!(stdout.contains("READ 10"), "{stdout}");
    assert!(stdout.contains("ALIVE"), "{stdout}");
}

/// The child: publishes 4KB records until the disk refuses, then shows it still serves.
#[test]
#[ignore = "helper run in a child process by another test"]
fn disk_full_publisher() {
    let Ok(db) = std::env::var("SAGUIN_DISKFULL_DB") else {
        return;
    };
    let p = SqliteProvider::open(&settings(std::path::Path::new(&db))).unwrap();
    smol::block_on(async {
        p.open_channel("events", ChannelSettings::append())
            .await
            .unwrap();
        let mut n = 0u64;
        let err = loop {
            match p.append("events", rec("e/x", &[1; 4096], n)).await {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
            assert!(n < 100_000, "the limit never bit");
        };
        println!("ERR {} after {n}: {err}", err.reason_code());
        let w = p
            .read_window("events", WindowRequest::new(0, 10, u64::MAX))
            .await
            .unwrap();
        println!("READ {}", w.records.len());
        let s = p.stats("events").await.unwrap();
        println!("ALIVE {} records", s.records);
    });
}
