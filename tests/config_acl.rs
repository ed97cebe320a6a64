//! The acl_file's startup refusals (RFC 0002 "What a client may do", req-0002b
//! sections 22-28): each invalid case names the requirement it pins, the key the
//! finding must name and its line in the acl_file; valid neighbours must load.

mod common;

use std::path::Path;

#[path = "common/mutate.rs"]
mod mutate;

use saguin::acl::{Policy, Subject, Verb};
use saguin::config::{self, Config};

/// A configuration with channels of every type, a braced one, and an acl_file.
const CONFIG: &str = "broker:
  id: edge-1
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
    password_file: /etc/saguin/clients.passwd
    acl_file: /etc/saguin/acl.yaml
channels:
  events:
    type: append
    filter: iot/+/events/#
  state:
    type: latest
    filter: iot/+/state/+
  jobs:
    type: queue
    filter: jobs/+
  weather:
    type: append
    filter: wx/+/{data,events}
";

fn config() -> Config {
    config::from_str(CONFIG, Path::new("saguin.yaml")).unwrap_or_else(|e| panic!("{e}"))
}

fn load(text: &str) -> Result<Policy, config::ConfigError> {
    config::acl::from_str(text, Path::new("acl.yaml"), &config())
}

fn line_of(text: &str, marker: &str) -> u32 {
    text.lines()
        .position(|l| l.contains(marker))
        .map(|i| i as u32 + 1)
        .unwrap_or_else(|| panic!("marker {marker:?} not in\n{text}"))
}

/// Every case ends with a users: block naming role r, unless it is about users:.
const USERS: &str = "users:\n  dev: [r]\n";

/// (requirement, acl text, key the finding names, marker of its line, words the text holds)
const INVALID: &[(&str, &str, &str, &str, &str)] = &[
    (
        "B-250",
        "roles:\n  r:\n    - topic: \"#\"\n      allow: [read]\nclients:\n  dev: [r]\n",
        "clients",
        "clients:",
        "write users:",
    ),
    (
        "B-252",
        "roles:\n  r:\n    - topic: \"#\"\n      allow: [read]\nusers:\n  dev: []\n",
        "users.dev.roles",
        "dev:",
        "no roles",
    ),
    (
        "B-252",
        "roles:\n  r:\n    - topic: \"#\"\n      allow: [read]\nusers:\n  dev:\n    client_ids: \"%u\"\n",
        "users.dev.roles",
        "dev:",
        "no roles",
    ),
    (
        "B-252",
        "roles:\n  r:\n    - topic: \"#\"\n      allow: [read]\nusers:\n  dev: [nope]\n",
        "users.dev.roles",
        "nope",
        "does not define",
    ),
    (
        "B-255",
        "roles:\n  r:\n    - channel: ev-%u\n      allow: [write]\n",
        "roles.r[0].channel",
        "ev-%u",
        "never into a channel's name",
    ),
    (
        "B-253",
        "roles:\n  r:\n    - channel: nosuch\n      allow: [write]\n",
        "roles.r[0].channel",
        "nosuch",
        "declare it under channels:",
    ),
    (
        "B-253",
        "roles:\n  r:\n    - channel: events\n      topic: x/#\n      allow: [write]\n",
        "roles.r[0]",
        "channel: events",
        "one rule each",
    ),
    (
        "B-260",
        "roles:\n  r:\n    - channel: events\n      filter: other/%u/#\n      allow: [write]\n",
        "roles.r[0].filter",
        "other/%u",
        "its filter is iot/+/events/#",
    ),
    (
        "B-261",
        "roles:\n  r:\n    - topic: alerts/#/page\n      allow: [read]\n",
        "roles.r[0].topic",
        "alerts/#/page",
        "# may only be the last level",
    ),
    (
        "B-261",
        "roles:\n  r:\n    - channel: events\n      filter: iot/a+/events/#\n      allow: [read]\n",
        "roles.r[0].filter",
        "a+",
        "whole level",
    ),
    (
        "B-277",
        "roles:\n  r:\n    - topic: iot/hq/events/#\n      allow: [read]\n",
        "roles.r[0].topic",
        "iot/hq/events",
        "topic iot/hq/events/# is inside channel events, whose filter is iot/+/events/#; write it as a channel rule",
    ),
    (
        "B-281",
        "roles:\n  r:\n    - channel: jobs\n      allow: [read]\n",
        "roles.r[0].allow",
        "allow: [read]",
        "metrics listener",
    ),
    (
        "B-280",
        "roles:\n  r:\n    - channel: events\n      allow: [consume]\n",
        "roles.r[0].allow",
        "consume",
        "write, read and seek",
    ),
    (
        "B-280",
        "roles:\n  r:\n    - channel: state\n      allow: [seek]\n",
        "roles.r[0].allow",
        "seek",
        "write, read and delete",
    ),
    (
        "B-283",
        "roles:\n  r:\n    - topic: \"#\"\n      allow: [disconnect]\n",
        "roles.r[0].allow",
        "disconnect",
        "broker: sessions",
    ),
    (
        "B-253",
        "roles:\n  r:\n    - channel: events\n",
        "roles.r[0].allow",
        "channel: events",
        "grants nothing",
    ),
    (
        "B-318",
        "roles:\n  r:\n    - channel: events\n      allow: [write]\n      deny: [will]\n",
        "roles.r[0].deny",
        "deny:",
        "only on a broker: features rule",
    ),
    (
        "B-318",
        "roles:\n  r:\n    - broker: features\n      allow: [will]\n",
        "roles.r[0].allow",
        "allow:",
        "takes deny: and nothing else",
    ),
    (
        "B-319",
        "roles:\n  r:\n    - broker: features\n      deny: [retain]\n",
        "roles.r[0].deny",
        "deny:",
        "write retained",
    ),
    (
        "B-318",
        "roles:\n  r:\n    - broker: features\n      deny: [will, will]\n",
        "roles.r[0].deny",
        "deny:",
        "listed twice",
    ),
    (
        "B-318",
        "roles:\n  r:\n    - broker: features\n      deny: [bridges]\n",
        "roles.r[0].deny",
        "deny:",
        "the features are persistent, will, share, retained, qos2",
    ),
    (
        "B-318",
        "roles:\n  r:\n    - broker: features\n",
        "roles.r[0].deny",
        "features",
        "takes nothing away",
    ),
    (
        "B-253",
        "roles:\n  r:\n    - broker: bridges\n      allow: [disconnect]\n",
        "roles.r[0].broker",
        "bridges",
        "sessions or features",
    ),
    (
        "B-267",
        "roles:\n  r:\n    - topic: \"#\"\n      allow: [read]\nusers:\n  \"a*\": [r]\n  \"*b\": [r]\n",
        "users.*b",
        "\"*b\"",
        "users.a* (line 6)",
    ),
    (
        "B-273",
        "roles:\n  r:\n    - topic: \"#\"\n      allow: [read]\nusers:\n  dev:\n    roles: [r]\n    client_ids: []\n",
        "users.dev.client_ids",
        "client_ids",
        "admits no client id",
    ),
    (
        "B-273",
        "roles:\n  r:\n    - topic: \"#\"\n      allow: [read]\nusers:\n  dev:\n    roles: [r]\n    client_ids:\n",
        "users.dev.client_ids",
        "client_ids",
        "admits no client id",
    ),
    (
        "B-117",
        "roles:\n  r:\n    - topic: \"#\"\n      allow: [read]\nusers:\n  dev:\n    roles: [r]\n    limits:\n      publish_rate: 0\n",
        "users.dev.limits.publish_rate",
        "publish_rate: 0",
        "is zero",
    ),
    (
        "B-117",
        "roles:\n  r:\n    - topic: \"#\"\n      allow: [read]\nusers:\n  dev:\n    roles: [r]\n    limits:\n      publish_bytes: 0KiB\n",
        "users.dev.limits.publish_bytes",
        "publish_bytes",
        "zero",
    ),
    (
        "B-114",
        "roles:\n  r:\n    - topic: \"#\"\n      allow: [read]\nusers:\n  dev:\n    roles: [r]\n    limits:\n      max_connections: 4\n",
        "users.dev.limits.max_connections",
        "max_connections",
        "the keys are publish_rate and publish_bytes",
    ),
];

#[test]
fn every_acl_rule_is_refused_naming_its_key_and_line() {
    let mut failures = Vec::new();
    for (req, body, key, marker, words) in INVALID {
        let text = if body.contains("users:") || body.contains("clients:") {
            body.to_string()
        } else {
            format!("{body}{USERS}")
        };
        let line = line_of(&text, marker);
        match load(&text) {
            Ok(_) => failures.push(format!("{req}: loaded\n{text}")),
            Err(e) => {
                let hit = e
                    .findings()
                    .iter()
                    .find(|f| f.key == *key && f.line == line && f.file == "acl.yaml");
                match hit {
                    Some(f) if f.line_text().contains(words) => {}
                    _ => failures.push(format!(
                        "{req}: wanted {key} at line {line} saying {words:?}, got:\n{e}"
                    )),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// B-108: an acl_file filter or topic deeper than limits.max_topic_levels (200 here)
/// is refused, naming its line; one at the limit loads.
#[test]
fn b108_acl_filters_deeper_than_max_topic_levels_are_refused() {
    let deep = |n: usize| vec!["l"; n].join("/");
    let topic_rule =
        |t: &str| format!("roles:\n  r:\n    - topic: {t}\n      allow: [read]\n{USERS}");
    let channel_rule = |f: &str| {
        format!(
            "roles:\n  r:\n    - channel: events\n      filter: {f}\n      allow: [read]\n{USERS}"
        )
    };
    for (text, key, line) in [
        (topic_rule(&deep(201)), "roles.r[0].topic", 3),
        (
            topic_rule(&format!("{}/#", deep(201))),
            "roles.r[0].topic",
            3,
        ),
        (
            channel_rule(&format!("iot/x/events/{}", deep(198))),
            "roles.r[0].filter",
            4,
        ),
    ] {
        let e = load(&text)
            .err()
            .unwrap_or_else(|| panic!("loaded:\n{text}"));
        let f = e
            .findings()
            .iter()
            .find(|f| f.key == key)
            .unwrap_or_else(|| panic!("{e}"));
        assert_eq!(f.line, line, "{e}");
        assert!(f.line_text().contains("max_topic_levels"), "{e}");
    }
    assert!(load(&topic_rule(&format!("{}/#", deep(200)))).is_ok());
}

/// The spec's examples, adapted to this configuration's channels, load.
const VALID: &str = "roles:
  telemetry-publisher:
    - channel: events
      filter: iot/%u/events/#
      allow: [write]
  job-worker:
    - channel: jobs
      allow: [write, consume]
    - channel: jobs__dlq
      allow: [read, seek]
  reader:
    - channel: events
      allow: [read, seek]
    - topic: alerts/#
      allow: [read]
    - topic: \"#\"
      allow: [write, read]
  sensor:
    - topic: health/%u/{cpu,disk}/%c
      allow: [write, read]
    - channel: weather
      filter: wx/+/data
      allow: [read]
  on-call:
    - broker: sessions
      allow: [disconnect]
    - broker: features
      deny: [persistent, will, share, retained, qos2]
users:
  \"vessel-*\": [telemetry-publisher, job-worker]
  dashboard:  [reader]
  \"cohort-north\":
    roles: [sensor]
    client_ids: \"north-*\"
  oncall:
    roles: [on-call]
    client_ids: [\"%u\", \"oncall-*\"]
  \"device-*\":
    roles: [reader]
    limits:
      publish_rate: 100
      publish_bytes: 64KiB
  device-7: [sensor]
  \"*-7\": [reader]
";

#[test]
fn b253_b263_b264_the_spec_examples_load() {
    let p = load(VALID).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.roles.len(), 5);
    assert_eq!(p.entries.len(), 7);
    // One braced rule is one grant per spelling (B-263), expanded before %u/%c.
    let sensor = &p.roles[3].rules[0];
    assert_eq!(
        sensor.subject,
        Subject::Topic {
            filters: vec!["health/%u/cpu/%c".into(), "health/%u/disk/%c".into()]
        }
    );
    assert!(sensor.verbs.has(Verb::Write) && sensor.verbs.has(Verb::Read));
    assert!(p.uses_client_id());
}

#[test]
fn b265_b266_the_most_exact_entry_applies() {
    let p = load(VALID).unwrap_or_else(|e| panic!("{e}"));
    let pattern = |u: &str| p.entry_for(u).map(|e| e.pattern.as_str());
    assert_eq!(pattern("device-7"), Some("device-7"));
    assert_eq!(pattern("device-8"), Some("device-*"));
    assert_eq!(pattern("sensor-7"), Some("*-7"));
    assert_eq!(pattern("nobody"), None);
    // B-114, B-115: the long form's limits belong to the entry, and the narrower
    // entry carrying none does not inherit them.
    let fleet = p.entry_for("device-8").and_then(|e| e.limits).unwrap();
    assert_eq!(fleet.publish_rate, Some(100));
    assert_eq!(fleet.publish_bytes, Some(64 * 1024));
    assert_eq!(p.entry_for("device-7").and_then(|e| e.limits), None);
}

#[test]
fn b269_b271_client_ids_with_percent_u() {
    let p = load(VALID).unwrap_or_else(|e| panic!("{e}"));
    let oncall = p.entry_for("oncall").unwrap();
    assert!(Policy::client_id_allowed(oncall, "oncall", "oncall"));
    assert!(Policy::client_id_allowed(oncall, "oncall", "oncall-2"));
    assert!(!Policy::client_id_allowed(oncall, "oncall", "north-1"));
    let north = p.entry_for("cohort-north").unwrap();
    assert!(Policy::client_id_allowed(north, "cohort-north", "north-17"));
    assert!(!Policy::client_id_allowed(north, "cohort-north", "south-1"));
    // B-271: a proved name holding * is never put in for %u.
    let wild = saguin::acl::Entry {
        pattern: "*".into(),
        roles: vec![0],
        client_ids: Some(vec!["%u".into()]),
        limits: None,
        line: 1,
    };
    assert!(!Policy::client_id_allowed(&wild, "a*", "a*"));
    assert!(!Policy::client_id_allowed(&wild, "a*", "ab"));
    // B-272: absent admits any.
    let dash = p.entry_for("dashboard").unwrap();
    assert!(Policy::client_id_allowed(dash, "dashboard", "anything"));
}

#[test]
fn b278_a_topic_rule_crossing_channels_loads() {
    let text = format!(
        "roles:\n  r:\n    - topic: \"+/telemetry\"\n      allow: [read]\n    - topic: \"iot/#\"\n      allow: [read]\n{USERS}"
    );
    load(&text).unwrap_or_else(|e| panic!("{e}"));
}

/// B-246, B-247 through --check-config, and a finding in the acl_file naming
/// the acl_file and its line.
#[test]
fn check_config_names_the_acl_file_and_line() {
    let dir = std::env::temp_dir().join(format!("saguin-acl-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let passwd = dir.join("clients.passwd");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/auth/clients.passwd"
        ),
        &passwd,
    )
    .unwrap();
    let acl = dir.join("acl.yaml");
    std::fs::write(
        &acl,
        "roles:\n  r:\n    - channel: jobs\n      allow: [read]\nusers:\n  dev: [r]\n",
    )
    .unwrap();
    let yaml = CONFIG
        .replace("/etc/saguin/clients.passwd", &passwd.display().to_string())
        .replace("/etc/saguin/acl.yaml", &acl.display().to_string());
    let cfg = dir.join("saguin.yaml");
    std::fs::write(&cfg, &yaml).unwrap();
    let out = common::run_saguin(&["--check-config".as_ref(), cfg.as_os_str()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("{}:", acl.display())), "{err}");
    assert!(err.contains("line 4: roles.r[0].allow read"), "{err}");
    // Fixed, it passes.
    std::fs::write(
        &acl,
        "roles:\n  r:\n    - channel: jobs\n      allow: [consume]\nusers:\n  dev: [r]\n",
    )
    .unwrap();
    let out = common::run_saguin(&["--check-config".as_ref(), cfg.as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory holding an acl_file whose line 4 is refused (read on a queue).
fn with_refused_acl_file(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("saguin-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let acl = dir.join("acl.yaml");
    std::fs::write(
        &acl,
        "roles:\n  r:\n    - channel: jobs\n      allow: [read]\nusers:\n  dev: [r]\n",
    )
    .unwrap();
    (dir, acl)
}

/// B-480: --check-config reports every finding, not the first stage's: a password
/// file that cannot be read and a refused acl_file rule, in one run.
#[test]
fn check_config_reports_a_missing_file_and_an_acl_finding_together_b480() {
    let (dir, acl) = with_refused_acl_file("acl-both");
    let missing = dir.join("no-such.passwd");
    let yaml = CONFIG
        .replace("/etc/saguin/clients.passwd", &missing.display().to_string())
        .replace("/etc/saguin/acl.yaml", &acl.display().to_string());
    let cfg = dir.join("saguin.yaml");
    std::fs::write(&cfg, &yaml).unwrap();
    let out = common::run_saguin(&["--check-config".as_ref(), cfg.as_os_str()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no-such.passwd"), "{err}");
    assert!(err.contains("line 4: roles.r[0].allow read"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// B-480 past the named files: a password file with a line it cannot take, a
/// certificate that is not PEM and a refused acl_file rule are all reported in one
/// run, each once - reading the gates' files stopped at the first, and was skipped
/// altogether when the acl_file was refused.
#[test]
fn check_config_reports_every_file_the_gates_cannot_take_b480() {
    let (dir, acl) = with_refused_acl_file("gates-all");
    let passwd = dir.join("clients.passwd");
    std::fs::write(&passwd, "not a password line\n").unwrap();
    std::fs::write(dir.join("cert.pem"), "not a certificate\n").unwrap();
    std::fs::write(dir.join("key.pem"), "not a key\n").unwrap();
    let yaml = CONFIG
        .replace("/etc/saguin/clients.passwd", &passwd.display().to_string())
        .replace("/etc/saguin/acl.yaml", &acl.display().to_string())
        .replace(
            "  mqtt:\n",
            &format!(
                "  mqtt:\n    listen:\n      tcp:\n        address: 127.0.0.1:0\n        tls:\n          cert_file: {0}/cert.pem\n          key_file: {0}/key.pem\n",
                dir.display()
            ),
        );
    let cfg = dir.join("saguin.yaml");
    std::fs::write(&cfg, &yaml).unwrap();
    let out = common::run_saguin(&["--check-config".as_ref(), cfg.as_os_str()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        err.matches("line 4: roles.r[0].allow read").count(),
        1,
        "the acl_file's finding, once:\n{err}"
    );
    assert!(err.contains("clients.passwd"), "the password file:\n{err}");
    assert!(err.contains("cert"), "the certificate:\n{err}");
    // A start refuses with the same findings.
    let started = common::refused_at_startup(&dir, &yaml);
    for said in ["roles.r[0].allow read", "clients.passwd", "holds no PEM"] {
        assert!(started.contains(said), "{said} in:\n{started}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An acl_file that is not YAML is one finding naming the acl_file and the line.
#[test]
fn an_acl_file_that_is_not_yaml_names_its_line() {
    let e = load("roles:\n  r: [\nusers: {\n").unwrap_err();
    let f = &e.findings()[0];
    assert_eq!(
        (f.file.as_str(), f.key.as_str()),
        ("acl.yaml", "the acl_file")
    );
    assert!(f.line > 0 && f.text.contains("not valid YAML"), "{e}");
}

/// The acl_file's cases and the spec's examples, mutated a few edits at a time: each
/// load refuses with findings on a line of the acl_file that say what to do, or
/// accepts - never a panic. Deterministic and bounded (`common/mutate.rs`).
#[test]
fn mutated_acl_files_are_refused_with_findings_or_accepted_never_a_panic() {
    let mut seeds: Vec<String> = INVALID
        .iter()
        .map(|(_, body, ..)| format!("{body}{USERS}"))
        .collect();
    seeds.push(VALID.to_owned());
    let config = config();
    let (accepted, refused) = mutate::check(
        &seeds,
        mutate::cases_and_rng(4000, 0x5A61_7569_6E21_0ACE),
        |text| config::acl::from_str(text, Path::new("m.yaml"), &config),
    );
    // Most seeds are refusals, so few mutations are accepted; both answers come.
    assert!(
        accepted > 5 && refused > 500,
        "{accepted} accepted, {refused} refused"
    );
}
