//! Password authentication against the real binary: Mosquitto's password file
//! (`$6$` and `$7$` as `mosquitto_passwd` writes them), `allow_anonymous` per broker
//! and per door, and SIGUSR1 re-reading the file (RFC 0002 "Who may connect").

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use common::{Broker, Raw};
use saguin::codec::ProtocolVersion::{self, V5, V311};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/auth/clients.passwd"
);
const BAD_USER_NAME_OR_PASSWORD: u8 = 0x86;
const V311_BAD_USER_NAME_OR_PASSWORD: u8 = 0x04;

/// A temp dir holding a copy of the fixture as `clients.passwd`.
fn dir_with_file(name: &str) -> (PathBuf, PathBuf) {
    let dir = common::temp_dir(name);
    let file = dir.join("clients.passwd");
    std::fs::copy(FIXTURE, &file).expect("copy the password file");
    (dir, file)
}

fn start(name: &str, extra: &str) -> Broker {
    let (dir, _) = dir_with_file(name);
    Broker::start_in(dir, &common::config(extra))
}

/// The CONNACK code for a CONNECT with these credentials.
fn code(
    addr: SocketAddr,
    protocol: ProtocolVersion,
    user: Option<&str>,
    password: Option<&str>,
) -> u8 {
    let mut connect = common::connect(protocol, "auth-test", true);
    connect.username = user.map(str::to_string);
    connect.password = password.map(|p| p.as_bytes().to_vec());
    Raw::handshake(addr, connect).1.code
}

/// B-230: a `$7$` line (alice) and a `$6$` line (bob) from mosquitto_passwd admit
/// their users, on MQTT 5 and 3.1.1.
#[test]
fn right_passwords_from_mosquitto_passwd_are_admitted_b230() {
    let broker = start("right", "    password_file: {dir}/clients.passwd\n");
    for protocol in [V5, V311] {
        assert_eq!(
            code(broker.addr, protocol, Some("alice"), Some("secret")),
            0
        );
        assert_eq!(code(broker.addr, protocol, Some("bob"), Some("hunter2")), 0);
    }
}

/// B-254, B-293: a session is its user's. Another user resuming its client id gets
/// a clean one - Session Present 0, none of what was queued for the first - while
/// the user who made it resumes it with everything it was owed.
#[test]
fn a_session_resumed_under_another_user_name_starts_clean() {
    let broker = start(
        "takeover-user",
        "    password_file: {dir}/clients.passwd
",
    );
    let resume = |user: &str, password: &str| {
        let mut c = common::connect(V5, "shared-id", false);
        c.properties.edit().session_expiry_interval = Some(300);
        c.username = Some(user.into());
        c.password = Some(password.as_bytes().to_vec());
        Raw::handshake(broker.addr, c)
    };
    let (mut alice, _) = resume("alice", "secret");
    alice.subscribe("private/#", common::opts(saguin::codec::QoS::AtLeastOnce));
    drop(alice);
    broker.wait_log("shared-id disconnected");
    let mut login = common::connect(V5, "publisher", true);
    login.username = Some("bob".into());
    login.password = Some(b"hunter2".to_vec());
    let (mut publisher, _) = Raw::handshake(broker.addr, login);
    let qos1 = saguin::codec::QoS::AtLeastOnce;
    assert_eq!(
        publisher.publish("private/a", b"for alice", qos1, false),
        Some(0)
    );
    let (mut alice, ack) = resume("alice", "secret");
    assert!(ack.session_present, "her own session");
    assert_eq!(&*alice.recv_publish().payload, b"for alice");
    drop(alice);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(
        publisher.publish("private/b", b"also hers", qos1, false),
        Some(0)
    );
    let (mut bob, ack) = resume("bob", "hunter2");
    assert!(!ack.session_present, "not bob's session");
    bob.expect_nothing(std::time::Duration::from_millis(300));
}

/// MQTT-3.1.2-4, -5 (3.1.1): a cleanSession 0 CONNECT that may not resume another
/// user's session starts a new one that still lasts: it is kept, and sent what was
/// published while it was away.
#[test]
fn a_311_session_started_clean_for_another_user_still_lasts() {
    use saguin::codec::{ProtocolVersion::V311, QoS};
    let broker = start(
        "takeover-user-311",
        "    password_file: {dir}/clients.passwd
",
    );
    let login = |user: &str, password: &str| {
        let mut c = common::connect(V311, "dev", false);
        c.username = Some(user.into());
        c.password = Some(password.as_bytes().to_vec());
        Raw::handshake(broker.addr, c)
    };
    let (mut alice, _) = login("alice", "secret");
    alice.subscribe("t", common::opts(QoS::AtLeastOnce));
    drop(alice);
    broker.wait_log("dev disconnected");
    let (mut bob, ack) = login("bob", "hunter2");
    assert!(!ack.session_present, "not bob's session");
    bob.subscribe("t", common::opts(QoS::AtLeastOnce));
    drop(bob);
    std::thread::sleep(std::time::Duration::from_millis(100));
    let mut c = common::connect(V5, "publisher-311", true);
    c.username = Some("alice".into());
    c.password = Some(b"secret".to_vec());
    let (mut publisher, _) = Raw::handshake(broker.addr, c);
    assert_eq!(
        publisher.publish("t", b"for bob", QoS::AtLeastOnce, false),
        Some(0)
    );
    let (mut bob, ack) = login("bob", "hunter2");
    assert!(ack.session_present, "bob's own session lasted");
    assert_eq!(&*bob.recv_publish().payload, b"for bob");
}

/// with no acl_file, an authenticated client may publish to and subscribe to
/// every channel, and broadcast.
#[test]
fn without_an_acl_file_an_authenticated_client_may_use_every_channel_a171() {
    let broker = start(
        "no-acl",
        "    password_file: {dir}/clients.passwd\nchannels:\n  events:\n    type: append\n  state:\n    type: latest\n  jobs:\n    type: queue\n",
    );
    let login = |id: &str, user: &str, password: &str| {
        let mut c = common::connect(V5, id, true);
        c.username = Some(user.into());
        c.password = Some(password.as_bytes().to_vec());
        let (raw, ack) = Raw::handshake(broker.addr, c);
        assert_eq!(ack.code, 0, "{user}");
        raw
    };
    let mut alice = login("alice-1", "alice", "secret");
    let q1 = common::opts(saguin::codec::QoS::AtLeastOnce);
    for filter in ["events/#", "state/#", "plain/#", "$saguin/queue/jobs"] {
        assert_eq!(alice.subscribe(filter, q1), [1], "{filter}");
    }
    let mut bob = login("bob-1", "bob", "hunter2");
    let topics = ["events/a", "jobs/a", "plain/a", "state/a"];
    for topic in topics {
        assert_eq!(
            bob.publish(topic, b"x", saguin::codec::QoS::AtLeastOnce, false),
            Some(0),
            "{topic}"
        );
    }
    let mut got: Vec<String> = (0..4)
        .map(|_| alice.recv_publish().topic.to_string())
        .collect();
    got.sort();
    assert_eq!(got, topics);
}

/// B-226: a wrong password, an unknown user and no user name at all are one code on
/// the wire: 0x86 on MQTT 5, 0x04 on 3.1.1. The log says which it was.
/// wrong and missing credentials are 0x86 (3.1.1 0x04).
#[test]
fn wrong_unknown_and_missing_credentials_are_all_0x86_b226() {
    let broker = start("wrong", "    password_file: {dir}/clients.passwd\n");
    let cases: [(Option<&str>, Option<&str>, &str); 5] = [
        (
            Some("alice"),
            Some("hunter2"),
            "wrong password for user \"alice\"",
        ),
        (
            Some("bob"),
            Some("secret"),
            "wrong password for user \"bob\"",
        ),
        (Some("alice"), None, "wrong password for user \"alice\""),
        (
            Some("mallory"),
            Some("secret"),
            "\"mallory\" is not in the password file",
        ),
        (None, None, "no user name"),
    ];
    for (user, password, logged) in cases {
        assert_eq!(
            code(broker.addr, V5, user, password),
            BAD_USER_NAME_OR_PASSWORD,
            "{user:?}/{password:?}"
        );
        broker.wait_log(logged);
        assert_eq!(
            code(broker.addr, V311, user, password),
            V311_BAD_USER_NAME_OR_PASSWORD,
            "{user:?}/{password:?}"
        );
        broker.wait_log(logged);
    }
}

/// B-223: with no password file and nothing written, everybody is admitted, a user
/// name included (there is nothing to check it against).
#[test]
fn no_file_admits_everybody_b223() {
    let broker = Broker::start("");
    assert_eq!(code(broker.addr, V5, None, None), 0);
    assert_eq!(code(broker.addr, V5, Some("anyone"), Some("x")), 0);
}

/// B-224: allow_anonymous: true beside a file admits clients with no user name and
/// still checks the ones that give one.
#[test]
fn anonymous_true_beside_a_file_still_checks_names_b224() {
    let broker = start(
        "mixed",
        "    password_file: {dir}/clients.passwd\n    allow_anonymous: true\n",
    );
    assert_eq!(code(broker.addr, V5, None, None), 0);
    assert_eq!(code(broker.addr, V311, None, None), 0);
    assert_eq!(code(broker.addr, V5, Some("alice"), Some("secret")), 0);
    assert_eq!(
        code(broker.addr, V5, Some("alice"), Some("nope")),
        BAD_USER_NAME_OR_PASSWORD
    );
}

/// B-173, B-220, B-222: per-door keys win. The first door writes its own password_file
/// (and so does not inherit the broker's allow_anonymous: true); the second inherits
/// the broker's file and answer.
#[test]
fn each_door_answers_for_itself_b220_b222() {
    let (dir, _) = dir_with_file("doors");
    let yaml = "broker:
  id: test
  log_level: debug
  storage:
    default: mem
    default_retention_period: none
    default_retention_bytes: none
    providers:
      mem:
        type: memory
        max_bytes: 64MiB
        snapshot_dir: none
  mqtt:
    password_file: {dir}/clients.passwd
    allow_anonymous: true
    listen:
      tcp:
        - name: fleet
          address: 127.0.0.1:0
          password_file: {dir}/clients.passwd
        - name: local
          address: 127.0.0.1:0
";
    let broker = Broker::start_in(dir, yaml);
    let fleet = broker.addr;
    let local: SocketAddr = broker
        .wait_log("listening on ")
        .split("listening on ")
        .nth(1)
        .and_then(|a| a.trim().parse().ok())
        .expect("the second door's address");
    assert_eq!(code(fleet, V5, None, None), BAD_USER_NAME_OR_PASSWORD);
    broker.wait_log("broker.mqtt.listen.tcp[fleet]");
    assert_eq!(code(fleet, V5, Some("alice"), Some("secret")), 0);
    assert_eq!(code(local, V5, None, None), 0);
    assert_eq!(
        code(local, V5, Some("alice"), Some("nope")),
        BAD_USER_NAME_OR_PASSWORD
    );
}

/// B-219: allow_anonymous: false on the door refuses a client with no user name
/// even where the door's file would admit it by name.
#[test]
fn a_door_refusing_anonymous_refuses_no_user_name_b219() {
    let (dir, _) = dir_with_file("door-anon");
    let yaml = common::config(
        "        password_file: {dir}/clients.passwd\n        allow_anonymous: false\n",
    );
    let broker = Broker::start_in(dir, &yaml);
    assert_eq!(
        code(broker.addr, V311, None, None),
        V311_BAD_USER_NAME_OR_PASSWORD
    );
    assert_eq!(code(broker.addr, V311, Some("bob"), Some("hunter2")), 0);
}

/// B-200: a CONNECT user name holding a control character is nobody's, even with a
/// password that would match a line.
#[test]
fn a_user_name_with_a_control_character_is_0x86_b200() {
    let broker = start("control", "    password_file: {dir}/clients.passwd\n");
    assert_eq!(
        code(broker.addr, V5, Some("alice\u{7}"), Some("secret")),
        BAD_USER_NAME_OR_PASSWORD
    );
    let line = broker.wait_log("control character");
    assert!(line.contains("WARN"), "{line}");
}

fn refused(name: &str, file_text: &str) -> String {
    let dir = common::temp_dir(name);
    std::fs::write(dir.join("clients.passwd"), file_text).expect("write the file");
    let yaml = common::config("    password_file: {dir}/clients.passwd\n")
        .replace("{dir}", &dir.display().to_string());
    common::refused_at_startup(&dir, &yaml)
}

/// B-231: an argon2id line stops the broker naming the file and the line.
#[test]
fn an_argon2_line_stops_the_broker_naming_file_and_line_b231() {
    let out = refused(
        "argon2",
        "# fleet\nbob:$argon2id$v=19$m=65536,t=3,p=1$c2FsdA$aGFzaA\n",
    );
    assert!(out.contains("clients.passwd line 2"), "{out}");
    assert!(out.contains("argon2"), "{out}");
}

/// B-232: a user on two lines stops the broker naming both lines.
#[test]
fn a_user_on_two_lines_stops_the_broker_b232() {
    let fixture = std::fs::read_to_string(FIXTURE).expect("fixture");
    let alice = fixture.lines().next().expect("alice's line");
    let out = refused("twice", &format!("{alice}\nbob:x\n{alice}\n"));
    // bob's plain-text line is line 2, and is found first.
    assert!(out.contains("line 2"), "{out}");
    let out = refused("twice", &format!("{alice}\n\n{alice}\n"));
    assert!(out.contains("line 3"), "{out}");
    assert!(out.contains("first on line 1"), "{out}");
}

/// B-218: a password file that cannot be read stops the broker naming it.
#[test]
fn an_unreadable_file_stops_the_broker() {
    let dir = common::temp_dir("unreadable");
    let yaml = common::config("    password_file: {dir}/missing.passwd\n")
        .replace("{dir}", &dir.display().to_string());
    let out = common::refused_at_startup(&dir, &yaml);
    assert!(out.contains("missing.passwd"), "{out}");
}

/// B-028, B-227, B-228: a user added to the file is refused until SIGUSR1; a reload that
/// cannot read the file keeps what was held (B-229).
#[test]
fn sigusr1_re_reads_the_file_b227_b229() {
    let (dir, file) = dir_with_file("reload");
    let broker = Broker::start_in(
        dir,
        &common::config("    password_file: {dir}/clients.passwd\n"),
    );
    let mut text = std::fs::read_to_string(&file).expect("read");
    let bob = text
        .lines()
        .nth(1)
        .expect("bob's line")
        .replacen("bob", "carol", 1);
    text.push_str(&bob);
    text.push('\n');
    std::fs::write(&file, &text).expect("add carol");
    assert_eq!(
        code(broker.addr, V5, Some("carol"), Some("hunter2")),
        BAD_USER_NAME_OR_PASSWORD
    );
    broker.signal("USR1");
    broker.wait_log("password files re-read");
    assert_eq!(code(broker.addr, V5, Some("carol"), Some("hunter2")), 0);

    // A file broken mid-edit changes nothing.
    std::fs::write(&file, "carol:$argon2id$x\n").expect("break the file");
    broker.signal("USR1");
    broker.wait_log("kept as it was");
    assert_eq!(code(broker.addr, V5, Some("alice"), Some("secret")), 0);
}

/// B-030, RFC 0002 "Who may connect": a SIGUSR1 that finds the configuration file
/// half-edited changes nothing, the password file it names included; the next one,
/// after the edit, applies both.
#[test]
fn a_configuration_that_does_not_load_holds_back_the_password_file_too_b030() {
    let (dir, file) = dir_with_file("reload-held");
    let yaml = common::config("    password_file: {dir}/clients.passwd\n");
    let broker = Broker::start_in(dir.clone(), &yaml);
    let written = std::fs::read_to_string(dir.join("saguin.yaml")).expect("the configuration");
    let mut text = std::fs::read_to_string(&file).expect("read");
    let carol = text
        .lines()
        .nth(1)
        .expect("bob's line")
        .replacen("bob", "carol", 1);
    text.push_str(&carol);
    text.push('\n');
    std::fs::write(&file, &text).expect("add carol");
    std::fs::write(dir.join("saguin.yaml"), "broker: [unfinished").expect("edit");
    broker.signal("USR1");
    broker.wait_log("nothing changed");
    assert_eq!(
        code(broker.addr, V5, Some("carol"), Some("hunter2")),
        BAD_USER_NAME_OR_PASSWORD
    );
    std::fs::write(dir.join("saguin.yaml"), written).expect("finish the edit");
    broker.signal("USR1");
    broker.wait_log("password files re-read");
    assert_eq!(code(broker.addr, V5, Some("carol"), Some("hunter2")), 0);
}

/// B-230 against the tool itself, when Debian's mosquitto_passwd is installed: both
/// hash kinds it writes, made now.
#[test]
fn files_mosquitto_passwd_writes_now_are_read_b230() {
    let tool = Path::new("/usr/bin/mosquitto_passwd");
    if !tool.exists() {
        eprintln!("skipped: /usr/bin/mosquitto_passwd is not installed");
        return;
    }
    let dir = common::temp_dir("mosquitto-passwd");
    let file = dir.join("clients.passwd");
    let run = |args: &[&str]| {
        let status = std::process::Command::new(tool)
            .args(args)
            .status()
            .expect("run mosquitto_passwd");
        assert!(status.success(), "mosquitto_passwd {args:?}");
    };
    let path = file.to_str().expect("utf-8 path");
    run(&["-c", "-b", path, "dora", "pbkdf2 pass"]);
    run(&["-H", "sha512", "-b", path, "eve", "sha pass"]);
    let broker = Broker::start_in(
        dir,
        &common::config("    password_file: {dir}/clients.passwd\n"),
    );
    assert_eq!(code(broker.addr, V5, Some("dora"), Some("pbkdf2 pass")), 0);
    assert_eq!(code(broker.addr, V311, Some("eve"), Some("sha pass")), 0);
    assert_eq!(
        code(broker.addr, V5, Some("eve"), Some("pbkdf2 pass")),
        BAD_USER_NAME_OR_PASSWORD
    );
}
