//! `saguin --acl` against the binary (RFC 0002 "Explaining a decision: --acl",
//! B-329..B-346).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/auth/clients.passwd"
);

const ACL: &str = "roles:
  device:
    - topic: iot/+/health/%u
      allow: [write, read]
    - channel: events
      filter: iot/%u/events/{a,b}
      allow: [write]
    - broker: features
      deny: [qos2]
  tour:
    - channel: events
      allow: [write, read, seek]
    - channel: jobs
      allow: [write, consume]
    - topic: \"#\"
      allow: [write, read]
  sensor:
    - topic: c/%u/%c
      allow: [write]
users:
  demo: [tour]
  \"device-*\":
    roles: [device]
    limits:
      publish_rate: 100
  device-7: [device, sensor]
";

/// A configuration in a directory of its own, with or without the acl_file.
fn setup(name: &str, with_acl: bool) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("saguin-acl-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(FIXTURE, dir.join("clients.passwd")).unwrap();
    std::fs::write(dir.join("acl.yaml"), ACL).unwrap();
    let acl = if with_acl {
        format!("    acl_file: {}/acl.yaml\n", dir.display())
    } else {
        String::new()
    };
    let yaml = format!(
        "broker:\n  id: t\n  storage:\n    default: mem\n    default_retention_period: none\n    default_retention_bytes: none\n    providers:\n      mem:\n        type: memory\n        max_bytes: 64MiB\n        snapshot_dir: none\n  limits:\n    publish_rate: 200\n  mqtt:\n    password_file: {}/clients.passwd\n{acl}channels:\n  events:\n    type: append\n    filter: iot/+/events/#\n  jobs:\n    type: queue\n    filter: jobs/+\n",
        dir.display()
    );
    let path = dir.join("saguin.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

fn run(config: &Path, args: &[&str], stdin: &str) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .arg("--acl")
        .arg(config)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A run that answers without reading stdin may close it first.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    // Standard output is the answer; the %c note and refusals go to stderr.
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = out.status.code().unwrap_or(-1);
    if code != 0 {
        text.push_str(&String::from_utf8_lossy(&out.stderr));
    }
    (code, text)
}

/// B-334..B-339: seven tab-separated columns, a row per spelling, %u put in, a
/// narrowed channel as `channel (filter)`, `no bound`, a row of - for nobody,
/// and the header skipped when fed back.
#[test]
fn the_list_form_has_a_row_per_grant_b334_b339() {
    let config = setup("list", true);
    let (code, out) = run(
        &config,
        &[],
        "# user\trole\ndemo\ndevice-7 n-1\nnobody\ndevice-8\n",
    );
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "# user\trole\tkind\tsubject\tverbs\trate\tbytes");
    assert!(lines.contains(&"demo\ttour\tchannel\tevents\twrite,read,seek\t200\tno bound"));
    assert!(
        lines
            .contains(&"device-7\tdevice\ttopic\tiot/+/health/device-7\twrite,read\t200\tno bound")
    );
    assert!(lines.contains(
        &"device-7\tdevice\tchannel\tevents (iot/device-7/events/a)\twrite\t200\tno bound"
    ));
    assert!(lines.contains(
        &"device-7\tdevice\tchannel\tevents (iot/device-7/events/b)\twrite\t200\tno bound"
    ));
    assert!(lines.contains(&"device-7\tsensor\ttopic\tc/device-7/n-1\twrite\t200\tno bound"));
    assert!(
        lines.contains(&"device-7\tdevice\tbroker\tfeatures\tdeny qos2\t200\tno bound"),
        "B-320"
    );
    assert!(lines.contains(&"nobody\t-\t-\t-\t-\t200\tno bound"));
    assert!(lines.iter().all(|l| l.split('\t').count() == 7));
    // B-115: the entry's figures, unwritten ones no bound, on every row.
    assert!(
        lines
            .contains(&"device-8\tdevice\ttopic\tiot/+/health/device-8\twrite,read\t100\tno bound")
    );
}

/// B-341, B-342: JSON lines, no header; null for -, [] for no verbs.
#[test]
fn the_list_form_as_json_b341_b342() {
    let config = setup("list-json", true);
    let (code, out) = run(&config, &["--json"], "device-7\nnobody\n");
    assert_eq!(code, 0, "{out}");
    let objects: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let nobody = objects.last().unwrap();
    assert_eq!(nobody["role"], serde_json::Value::Null);
    assert_eq!(nobody["verbs"], serde_json::json!([]));
    assert_eq!(nobody["denies"], serde_json::json!([]));
    assert_eq!(nobody["publish_rate"], 200);
    assert_eq!(nobody["publish_bytes"], serde_json::Value::Null);
    assert!(
        objects
            .iter()
            .any(|o| o["denies"] == serde_json::json!(["qos2"]))
    );
}

/// B-329, B-330, B-332, B-331, B-258: the paragraph form names the entry in force
/// and the one it shadows, and says what %c without a client id leaves.
#[test]
fn the_paragraph_form_names_the_entry_and_what_it_shadows_b332() {
    let config = setup("one", true);
    let (code, out) = run(&config, &["device-7"], "");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("entry in force: users.device-7"), "{out}");
    assert!(out.contains("shadowed: users.device-*"), "{out}");
    assert!(
        out.contains("users.device-* carries limits:"),
        "B-332 {out}"
    );
    assert!(out.contains("no client id was given"), "{out}");
    assert!(out.contains("%c is whatever the device typed"), "{out}");
}

/// B-343, B-344, B-333: the single-user object carries every key; a client id
/// holding / withholds the %c rule.
#[test]
fn the_single_user_object_b343_b344() {
    let config = setup("one-json", true);
    let (code, out) = run(&config, &["device-7", "n/1", "--json"], "");
    assert_eq!(code, 0, "{out}");
    let o: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(o["pattern_applied"], "device-7");
    assert_eq!(
        o["patterns_matched"],
        serde_json::json!(["device-*", "device-7"])
    );
    assert_eq!(
        o["patterns_in_file"],
        serde_json::json!(["demo", "device-*", "device-7"])
    );
    assert_eq!(o["client_id_allowed"], true);
    assert_eq!(o["grants_withheld"][0]["subject"], "c/%u/%c");
    let (_, out) = run(&config, &["nobody", "--json"], "");
    let o: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(o["pattern_applied"], serde_json::Value::Null);
    assert_eq!(o["client_id_allowed"], serde_json::Value::Null);
}

/// B-340, B-345, B-346: no acl_file is one sentence or one object; --json alone
/// is refused.
#[test]
fn no_acl_file_says_everything_is_allowed_b340_b345() {
    let config = setup("none", false);
    let (code, out) = run(&config, &["demo"], "");
    assert_eq!(code, 0);
    assert!(
        out.contains("names no acl_file: every authenticated client may do anything"),
        "{out}"
    );
    assert!(out.contains(&config.display().to_string()), "{out}");
    let (_, out) = run(&config, &["--json"], "demo\n");
    assert_eq!(out.trim(), r#"{"acl_file":null,"everything_allowed":true}"#);
    let refused = Command::new(env!("CARGO_BIN_EXE_saguin"))
        .arg("--json")
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
}
