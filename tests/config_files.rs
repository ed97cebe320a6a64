//! Whole files: the spec's example, `!include` with every rule, and
//! `--check-config --output` round trips (B-124 … B-138, B-556, B-557).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use saguin::config::{self, ChannelType, CommitMode, ConfigError, ProviderKind};

fn fixture(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/config")
        .join(p)
}

/// A scratch directory of files for one test.
fn scratch(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("saguin-config-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    for (p, text) in files {
        let path = dir.join(p);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }
    dir
}

fn finding<'a>(err: &'a ConfigError, key: &str) -> &'a config::Finding {
    err.findings()
        .iter()
        .find(|f| f.key == key)
        .unwrap_or_else(|| panic!("no finding for {key}:\n{err}"))
}

/// B-004, B-012, B-013: the mqtt keys, brace expansion, sizes and durations.
#[test]
fn spec_example_loads_with_every_value_typed() {
    let c = config::load(&fixture("spec-example.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = c.channels.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["device-state", "events", "jobs", "jobs__dlq", "presence"]
    );
    let ds = c.channel("device-state").unwrap();
    assert_eq!(ds.filters, ["iot/+/+/state", "iot/+/+/location"]);
    assert_eq!(ds.storage, "volatile");
    assert_eq!(ds.retention_period, Some(Duration::from_secs(30 * 86400)));
    let presence = c.channel("presence").unwrap();
    assert_eq!(presence.filters, ["presence/#"], "B-011");
    assert_eq!(presence.retention_period, None);
    let dlq = c.channel("jobs__dlq").unwrap();
    assert_eq!(dlq.kind, ChannelType::Append);
    assert_eq!(dlq.filters, ["iot/+/+/work/__dlq"]);
    assert_eq!(dlq.storage, "local");
    assert_eq!(dlq.retention_bytes, Some(1 << 30));
    let jobs = c.channel("jobs").unwrap().queue.as_ref().unwrap();
    assert_eq!(jobs.job_expires_after, Some(Duration::from_secs(6 * 3600)));
    assert_eq!(jobs.retry.backoff_base, Some(Duration::from_secs(2)));
    let ops = c.broker.operations.as_ref().unwrap();
    assert_eq!(ops.min_scrape_interval, Duration::from_secs(60));
    match &c.broker.storage.providers["local"].kind {
        ProviderKind::Sqlite(s) => {
            assert_eq!(s.commit, CommitMode::Collect);
            assert_eq!(s.read_connections, 2);
            assert_eq!(s.flush_interval, Duration::from_millis(150));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.broker.session.storage, "local");
    assert_eq!(c.broker.qos2.max_inflight_per_client, 20);
    assert_eq!(c.broker.qos2.expires_after, Duration::from_secs(300));
    assert_eq!(c.broker.share.expires_after, None);
    assert_eq!(
        c.broker.session.ack_commit_interval,
        Duration::from_millis(200)
    );
}

/// B-001, B-006, B-125, B-127, B-135: `!include` under channels and providers.
#[test]
fn b124_b127_b135_b136_split_files_resolve_against_the_including_file() {
    let c = config::load(&fixture("split/saguin.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = c.channels.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        ["events", "readings", "vessel-jobs", "vessel-jobs__dlq"]
    );
    assert!(
        c.channel("readings")
            .unwrap()
            .origin
            .file
            .ends_with("channels/telemetry.yaml")
    );
    assert_eq!(c.broker.storage.providers.len(), 2);
    assert!(
        c.broker.storage.providers["local"]
            .origin
            .file
            .ends_with("storage/local.yaml")
    );
    // A channel in one file names a provider defined in another (B-136).
    assert_eq!(c.channel("vessel-jobs").unwrap().storage, "volatile");
}

/// A-048, B-131: moving channels between `!include` files changes no route.
#[test]
fn b131_the_order_files_are_named_in_decides_nothing() {
    let a = config::load(&fixture("split/saguin.yaml")).unwrap();
    let text = fs::read_to_string(fixture("split/saguin.yaml")).unwrap();
    let swapped = text.replace(
        "  - !include channels/telemetry.yaml\n  - !include channels/vessel-07/jobs.yaml\n",
        "  - !include channels/vessel-07/jobs.yaml\n  - !include channels/telemetry.yaml\n",
    );
    assert_ne!(text, swapped);
    let b = config::from_str(&swapped, &fixture("split/saguin.yaml")).unwrap();
    let ra = saguin::routing::Router::new(&a);
    let rb = saguin::routing::Router::new(&b);
    for topic in [
        "readings/x",
        "fleet/vessel-07/jobs/1",
        "events/orders/123",
        "other",
    ] {
        assert_eq!(ra.resolve(topic), rb.resolve(topic), "{topic}");
    }
}

const HEAD: &str = "broker:\n  id: a\n  storage:\n    default: local\n    default_retention_period: 3d\n    default_retention_bytes: none\n    providers:\n      local: {type: memory, snapshot_dir: none}\n";

/// B-001, B-126: `!include` elsewhere is refused.
#[test]
fn b126_include_anywhere_else_is_refused() {
    let dir = scratch(
        "b126",
        &[
            ("x.yaml", "id: b\n"),
            ("saguin.yaml", &format!("{HEAD}  mqtt: !include x.yaml\n")),
        ],
    );
    let err = config::load(&dir.join("saguin.yaml")).unwrap_err();
    assert_eq!(finding(&err, "broker.mqtt").line, 9, "{err}");
}

/// B-128: no nested `!include`.
#[test]
fn b128_includes_do_not_nest() {
    let dir = scratch(
        "b128",
        &[
            ("a.yaml", "x:\n  type: append\n  filter: !include b.yaml\n"),
            ("b.yaml", "x/#\n"),
            (
                "saguin.yaml",
                &format!("{HEAD}channels:\n  - !include a.yaml\n"),
            ),
        ],
    );
    let err = config::load(&dir.join("saguin.yaml")).unwrap_err();
    let f = finding(&err, "!include");
    assert!(f.file.ends_with("a.yaml") && f.line == 3, "{err}");
}

/// B-129: a channel defined in two files names both.
#[test]
fn b129_a_name_defined_twice_names_both_files() {
    let dir = scratch(
        "b129",
        &[
            ("one.yaml", "events:\n  type: append\n"),
            ("two.yaml", "\nevents:\n  type: latest\n  filter: other/#\n"),
            (
                "saguin.yaml",
                &format!("{HEAD}channels:\n  - !include one.yaml\n  - !include two.yaml\n"),
            ),
        ],
    );
    let err = config::load(&dir.join("saguin.yaml")).unwrap_err();
    let f = finding(&err, "channels.events");
    assert!(f.file.ends_with("two.yaml") && f.line == 2, "{err}");
    assert!(f.text.contains("one.yaml line 1"), "{err}");
}

/// B-130: one filter in two files names both.
#[test]
fn b130_the_same_filter_in_two_files_names_both() {
    let dir = scratch(
        "b130",
        &[
            ("one.yaml", "a:\n  type: append\n  filter: site/#\n"),
            ("two.yaml", "b:\n  type: latest\n  filter: site/#\n"),
            (
                "saguin.yaml",
                &format!("{HEAD}channels:\n  - !include one.yaml\n  - !include two.yaml\n"),
            ),
        ],
    );
    let err = config::load(&dir.join("saguin.yaml")).unwrap_err();
    let f = finding(&err, "channels.b.filter");
    assert!(
        f.file.ends_with("two.yaml") && f.line == 1 && f.text.contains("one.yaml line 1"),
        "{err}"
    );
}

#[test]
fn b132_globs_are_refused() {
    let dir = scratch(
        "b132",
        &[(
            "saguin.yaml",
            &format!("{HEAD}channels:\n  - !include channels/*.yaml\n"),
        )],
    );
    let err = config::load(&dir.join("saguin.yaml")).unwrap_err();
    assert_eq!(finding(&err, "channels[0]").line, 10, "{err}");
}

/// B-133: an unknown key in an included file names that file.
/// B-134: an included file's findings carry exact line numbers.
#[test]
fn b133_b134_an_unknown_key_in_an_included_file_names_that_file_and_its_line() {
    let dir = scratch(
        "b133",
        &[
            (
                "ch.yaml",
                "# a comment\nreadings:\n  type: append\n  colour: blue\n",
            ),
            (
                "saguin.yaml",
                &format!("{HEAD}channels:\n  - !include ch.yaml\n"),
            ),
        ],
    );
    let err = config::load(&dir.join("saguin.yaml")).unwrap_err();
    let f = finding(&err, "channels.readings.colour");
    assert!(f.file.ends_with("ch.yaml") && f.line == 4, "{err}");
    assert!(
        err.to_string()
            .contains("ch.yaml:\n  - line 4: channels.readings.colour"),
        "{err}"
    );
}

#[test]
fn unreadable_include_names_the_resolved_path() {
    let dir = scratch(
        "missing",
        &[(
            "saguin.yaml",
            &format!("{HEAD}channels:\n  - !include nope.yaml\n"),
        )],
    );
    let err = config::load(&dir.join("saguin.yaml")).unwrap_err();
    assert!(
        finding(&err, "channels[0]").text.contains("nope.yaml"),
        "{err}"
    );
}

#[test]
fn b137_two_providers_on_one_store_are_refused_after_cleaning() {
    let dir = scratch(
        "b137",
        &[
            (
                "p.yaml",
                "b:\n  type: sqlite\n  file_path: /var/lib/./x/s.db\n",
            ),
            (
                "saguin.yaml",
                "broker:\n  id: a\n  storage:\n    default: a\n    default_retention_period: none\n    default_retention_bytes: none\n    providers:\n      - a: {type: sqlite, file_path: /var/lib/x/s.db}\n      - !include p.yaml\n",
            ),
        ],
    );
    let err = config::load(&dir.join("saguin.yaml")).unwrap_err();
    let f = finding(&err, "broker.storage.providers.b.file_path");
    assert!(
        f.file.ends_with("p.yaml") && f.text.contains("provider a"),
        "{err}"
    );
}

#[test]
fn two_providers_on_one_snapshot_dir_are_refused_naming_both_and_both_files_b137() {
    let dir = scratch(
        "b137-snap",
        &[
            (
                "p.yaml",
                "b:\n  type: memory\n  snapshot_dir: /var/lib/./x/snaps\n",
            ),
            (
                "saguin.yaml",
                "broker:\n  id: a\n  storage:\n    default: a\n    default_retention_period: none\n    default_retention_bytes: none\n    providers:\n      - a: {type: memory, snapshot_dir: /var/lib/x/snaps}\n      - !include p.yaml\n",
            ),
        ],
    );
    let err = config::load(&dir.join("saguin.yaml")).unwrap_err();
    let f = finding(&err, "broker.storage.providers.b.snapshot_dir");
    assert!(
        f.file.ends_with("p.yaml")
            && f.text.contains("provider a")
            && f.text.contains("saguin.yaml line 8"),
        "{err}"
    );
}

/// B-019: `--check-config` on a refused file prints the header, the file and one
/// `  - ` line per finding, and exits non-zero.
#[test]
fn check_config_prints_the_report_shape_b019() {
    let dir = scratch(
        "b019",
        &[(
            "saguin.yaml",
            &format!("{HEAD}  log_level: verbose\n  colour: blue\n"),
        )],
    );
    let path = dir.join("saguin.yaml");
    let out = common::run_saguin(&["--check-config".as_ref(), path.as_os_str()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines[0], "configuration is invalid:", "{err}");
    assert_eq!(lines[1], format!("{}:", path.display()), "{err}");
    assert_eq!(lines.len(), 4, "{err}");
    assert_eq!(
        lines[2],
        "  - line 9: broker.log_level \"verbose\": it is one of debug, info, warn or error; omit the key for info",
        "{err}"
    );
    assert!(lines[3].starts_with("  - line 10: broker.colour"), "{err}");
}

#[test]
fn b556_b557_output_loads_again_unchanged() {
    for p in [
        "spec-example.yaml",
        "split/saguin.yaml",
        "minimal.yaml",
        "route-depot.yaml",
        "bridges.yaml",
    ] {
        let first = config::load(&fixture(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        let text = config::render(&first);
        let again =
            config::from_str(&text, &first.source).unwrap_or_else(|e| panic!("{p}: {e}\n{text}"));
        // Equal but for the provenance comments, which now point into the rendered text.
        let uncommented = |s: &str| {
            s.lines()
                .map(|l| l.split(" #").next().unwrap_or(l).to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            uncommented(&config::render(&again)),
            uncommented(&text),
            "{p}"
        );
        let strip = |c: &config::Config| {
            let mut v = c.channels.clone();
            for ch in &mut v {
                ch.origin = config::Origin {
                    file: String::new(),
                    line: 0,
                };
                ch.written.clear();
            }
            v
        };
        assert_eq!(strip(&first), strip(&again), "{p}");
        assert_eq!(first.broker.limits, again.broker.limits, "{p}");
        assert_eq!(first.bridges.len(), again.bridges.len(), "{p}");
    }
}

/// B-556, B-557: what YAML reads as a boolean or null in any case is quoted, and two
/// bridge rules written on one line are both printed: the output loads as the same
/// configuration.
#[test]
fn b556_output_quotes_every_boolean_spelling_and_keeps_rules_sharing_a_line() {
    let fixture = std::fs::read_to_string(fixture("bridges.yaml")).expect("fixture");
    let (head, _) = fixture.split_once("    topics:\n").expect("a topics list");
    let text = format!(
        "{}    topics: [{{filter: a/#, topic: x/$#, direction: in}}, {{filter: b/#, topic: y/$#, direction: in}}]\n",
        head.replace("  id: vessel-07", "  id: \"Yes\"")
            .replace("client_id: vessel-07", "client_id: \"-1\"")
    );
    let first =
        config::from_str(&text, Path::new("saguin.yaml")).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(first.bridges[0].topics.len(), 2, "{text}");
    let rendered = config::render(&first);
    let again = config::from_str(&rendered, Path::new("saguin.yaml"))
        .unwrap_or_else(|e| panic!("{e}\n{rendered}"));
    assert_eq!(again.broker.id, "Yes", "{rendered}");
    assert_eq!(again.bridges[0].client_id, "-1", "{rendered}");
    assert_eq!(again.bridges[0].topics.len(), 2, "{rendered}");
}

/// B-557, B-175: a single door written as a named list keeps its name in the output.
#[test]
fn b557_output_keeps_the_name_of_a_single_named_door() {
    let text = "broker:\n  id: a\n  storage:\n    default: m\n    default_retention_period: none\n    default_retention_bytes: none\n    providers:\n      m:\n        type: memory\n        max_bytes: 64MiB\n        snapshot_dir: none\n  mqtt:\n    listen:\n      tcp:\n        - name: fleet\n          address: 127.0.0.1:1883\n      ws:\n        - name: hmi\n          address: 127.0.0.1:8083\n";
    let first = config::from_str(text, Path::new("saguin.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let rendered = config::render(&first);
    let again = config::from_str(&rendered, Path::new("saguin.yaml"))
        .unwrap_or_else(|e| panic!("{e}\n{rendered}"));
    let listen = &again.broker.mqtt.listen;
    assert_eq!(listen.tcp[0].name, "fleet", "{rendered}");
    assert_eq!(listen.ws[0].name, "hmi", "{rendered}");
}

#[test]
fn b556_output_marks_each_channel_with_its_file_and_omits_dead_letters() {
    let c = config::load(&fixture("split/saguin.yaml")).unwrap();
    let text = config::render(&c);
    assert!(
        text.contains("readings: #") && text.contains("channels/telemetry.yaml"),
        "{text}"
    );
    assert!(!text.contains("__dlq"), "{text}");
    assert!(!text.contains("!include"), "{text}");
    // A channel that named no provider says which one it got.
    let c = config::load(&fixture("spec-example.yaml")).unwrap();
    let text = config::render(&c);
    assert!(
        text.contains("filter: \"iot/+/+/{state,location}\""),
        "A-021: {text}"
    );
}

/// B-551: every unreadable named file (password file, certificate, key) at once.
#[test]
fn b551_check_files_reports_every_unreadable_file_at_once() {
    let c = config::load(&fixture("spec-example.yaml")).unwrap();
    let err = c.check_files().unwrap_err();
    let keys: Vec<&str> = err.findings().iter().map(|f| f.key.as_str()).collect();
    assert!(keys.contains(&"broker.mqtt.password_file"), "{err}");
    assert!(
        keys.contains(&"broker.mqtt.listen.tcp.tls.cert_file"),
        "{err}"
    );
    assert!(
        keys.contains(&"broker.mqtt.listen.tcp.tls.key_file"),
        "{err}"
    );
    assert!(err.findings().iter().all(|f| f.line > 0), "{err}");
}

/// B-551 through the binary: every kind of named file (both password files, the
/// certificate, key and client CA, and a bridge's CA), each with its line, in one
/// report; a directory named as a file is refused too, though it opens.
#[test]
fn b551_check_config_names_every_unreadable_file_and_a_directory() {
    let run = |path: &Path| {
        let out = common::run_saguin(&["--check-config".as_ref(), path.as_os_str()]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&fixture("full.yaml"));
    for (line, key) in [
        (15, "broker.mqtt.listen.tcp[1].tls.cert_file"),
        (16, "broker.mqtt.listen.tcp[1].tls.key_file"),
        (17, "broker.mqtt.listen.tcp[1].tls.client_ca_file"),
        (33, "broker.mqtt.password_file"),
        (36, "broker.operations.password_file"),
        (100, "bridges.head-office.ca_file"),
    ] {
        let said = format!("  - line {line}: {key} ");
        assert!(
            err.lines()
                .any(|l| l.starts_with(&said) && l.contains("cannot be read")),
            "{said}\n{err}"
        );
    }

    let dir = scratch("b551-dir", &[("passwd/keep", "")]);
    let yaml = format!(
        "{HEAD}  mqtt:\n    password_file: {}\n",
        dir.join("passwd").display()
    );
    fs::write(dir.join("saguin.yaml"), yaml).unwrap();
    let err = run(&dir.join("saguin.yaml"));
    assert!(
        err.contains("broker.mqtt.password_file")
            && err.contains("is a directory; name the file in it"),
        "{err}"
    );
}

#[test]
fn b550_summary_lists_the_file_and_channels() {
    let c = config::load(&fixture("spec-example.yaml")).unwrap();
    let s = config::summary(&c);
    assert!(
        s.starts_with(&format!("{}: ok\n", c.source.display())),
        "{s}"
    );
    assert!(s.contains("  jobs__dlq") && s.contains("append"), "{s}");
}

/// B-002, B-003, B-005, B-006, B-173: every block, broker key and door key loads.
#[test]
fn full_fixture_reads_every_shape() {
    let c = config::load(&fixture("full.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.broker.id, "42", "a number is taken as its text");
    let l = &c.broker.mqtt.listen;
    assert_eq!(
        l.tcp.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["local", "fleet"]
    );
    assert_eq!(l.unix[0].mode, 0o600);
    assert!(l.unix[0].proxy_protocol);
    let tls = l.tcp[1].tls.as_ref().unwrap();
    assert!(!tls.require_certificate);
    assert_eq!(tls.min_version, config::TlsVersion::V1_3);
    assert_eq!(l.ws[0].allowed_origins.len(), 2);
    assert_eq!(c.broker.limits.session_queue_bytes, 1 << 20);
    assert_eq!(c.broker.limits.max_connect_size, 100 << 10);
    match &c.broker.storage.providers["local"].kind {
        ProviderKind::Sqlite(s) => {
            assert_eq!(
                s.commit,
                CommitMode::Batch {
                    interval: Duration::from_millis(2),
                    max_records: 32
                }
            )
        }
        other => panic!("{other:?}"),
    }
    match &c.broker.storage.providers["each"].kind {
        ProviderKind::Sqlite(s) => assert_eq!(s.commit, CommitMode::PerPublish),
        other => panic!("{other:?}"),
    }
    // Braces in a bridge filter expand into one rule per spelling (B-542).
    let rules = &c.bridges[0].topics;
    assert_eq!(
        rules.iter().map(|r| r.filter.as_str()).collect::<Vec<_>>(),
        [
            "fleet/+/telemetry/#",
            "fleet/+/events/#",
            "iot/+/+/commands"
        ]
    );
    assert_eq!(c.channel("work__dlq").unwrap().retention_period, None);
    assert_eq!(
        c.channel("work__dlq").unwrap().retention_bytes,
        Some(20 << 30)
    );
    assert_eq!(c.channel("state").unwrap().deletion_retention_period, None);
}

/// `cargo test --test config_files -- --ignored --nocapture` prints the
/// resolved document and the summary of the full fixture.
#[test]
#[ignore]
fn print_output_of_the_full_fixture() {
    let c = config::load(&fixture("full.yaml")).unwrap();
    println!("{}", config::render(&c));
    println!("{}", config::summary(&c));
}

/// Everything that accumulates is bounded, a configuration's parse too: a few lines
/// whose aliases nest (a "billion laughs") are refused as a finding, not expanded
/// into memory.
#[test]
fn nested_aliases_are_refused_not_expanded() {
    let mut text = String::from("l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n");
    // 10^6 scalars once expanded: under the parser's own default budget.
    for level in 1..6 {
        let prev = level - 1;
        let refs = vec![format!("*l{prev}"); 10].join(", ");
        text.push_str(&format!("l{level}: &l{level} [{refs}]\n"));
    }
    let err = config::from_str(&text, Path::new("bomb.yaml")).expect_err("refused");
    let said = err.to_string();
    assert!(
        said.contains("bomb.yaml") && said.contains("alias"),
        "{said}"
    );
}
