//! `saguin --passwd` (B-559..B-563): the file it writes is read by the broker and, where
//! Debian's mosquitto is installed, by mosquitto itself.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Broker, Raw, WAIT, connect, temp_dir};
use saguin::codec::ProtocolVersion::V5;

fn passwd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_saguin"))
        .arg("--passwd")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("saguin --passwd runs")
}

fn ok(args: &[&str]) -> String {
    let out = passwd(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

#[test]
fn add_list_delete_and_the_modes_it_leaves() {
    let dir = temp_dir("passwd");
    let file = dir.join("clients.passwd");
    let f = file.to_str().expect("utf-8 path");
    ok(&["add", f, "alice", "s3cret"]);
    assert_eq!(mode(&file), 0o600, "a new file is 0600 (B-563)");
    let text = std::fs::read_to_string(&file).expect("read");
    assert!(text.starts_with("alice:$7$1000$"), "B-562: {text}");
    ok(&["add", f, "bob", "hunter2"]);
    assert_eq!(ok(&["list", f]), "alice\nbob\n");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    ok(&["delete", f, "alice"]);
    assert_eq!(mode(&file), 0o640, "an existing file keeps its mode");
    assert_eq!(ok(&["list", f]), "bob\n");
    assert!(!passwd(&["delete", f, "alice"]).status.success());
    assert!(!passwd(&["add", f, "a:b", "x"]).status.success());
    assert!(
        !passwd(&["list", dir.join("none").to_str().expect("path")])
            .status
            .success()
    );
    // No password and no terminal: refused rather than stored empty (B-560).
    assert!(!passwd(&["add", f, "carol"]).status.success());
    assert_eq!(ok(&["list", f]), "bob\n");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_broker_admits_a_user_the_command_added() {
    let dir = temp_dir("passwd-broker");
    let file = dir.join("clients.passwd");
    ok(&["add", file.to_str().expect("path"), "device-7", "s3cret"]);
    let broker = Broker::start_in(
        dir,
        &common::config("    password_file: {dir}/clients.passwd\n"),
    );
    let mut good = connect(V5, "d7", true);
    good.username = Some("device-7".into());
    good.password = Some(b"s3cret".to_vec());
    assert_eq!(Raw::handshake(broker.addr, good.clone()).1.code, 0);
    good.password = Some(b"wrong".to_vec());
    assert_eq!(Raw::handshake(broker.addr, good).1.code, 0x86);
}

#[test]
fn mosquitto_reads_the_file_when_installed() {
    let mosquitto = ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let have_pub = Command::new("mosquitto_pub").arg("--help").output().is_ok();
    let (Some(mosquitto), true) = (mosquitto, have_pub) else {
        eprintln!("mosquitto not installed: skipped (CI installs it)");
        return;
    };
    let dir = temp_dir("passwd-mosquitto");
    let file = dir.join("clients.passwd");
    ok(&["add", file.to_str().expect("path"), "bob", "hunter2"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!(
            // `user root`: started as root (CI), mosquitto would otherwise drop to a
            // user that cannot read a 0600 file of root's; otherwise it is ignored.
            "user root\nlistener {port} 127.0.0.1\nallow_anonymous false\npassword_file {}\n",
            file.display()
        ),
    )
    .expect("mosquitto.conf");
    let mut broker = Command::new(mosquitto)
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto starts");
    let deadline = Instant::now() + WAIT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "mosquitto did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let publish = |password: &str| {
        Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-u", "bob", "-P", password, "-t", "t", "-m", "x"])
            .status()
            .expect("mosquitto_pub runs")
            .success()
    };
    let (right, wrong) = (publish("hunter2"), publish("nope"));
    let _ = broker.kill();
    let _ = broker.wait();
    let _ = std::fs::remove_dir_all(dir);
    assert!(right, "mosquitto admits the password saguin --passwd wrote");
    assert!(!wrong, "and refuses a wrong one");
}
