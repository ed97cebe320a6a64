//! Routing: where a topic lands and what a filter reaches, golden against
//! the spec's own tables (A-008, B-347 … B-353; RFC 0002 "--route").

mod common;

use std::path::Path;

use saguin::codec::{ProtocolVersion::V5, QoS};
use saguin::config::{self, ChannelType};
use saguin::routing::{self, Route, Router, Serves};

fn router(p: &str) -> (config::Config, Router) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/config")
        .join(p);
    let c = config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let r = Router::new(&c);
    (c, r)
}

fn lands(r: &Router, topic: &str) -> Option<&'static str> {
    match r.resolve(topic) {
        Route::Channel { name, .. } => Some(Box::leak(name.to_string().into_boxed_str())),
        Route::Broadcast => None,
    }
}

/// A-001, A-002, A-007, A-042, A-047: overlapping filters load; each claims what it matches.
/// A-003: a topic no filter claims is broadcast, with no key saying so.
#[test]
fn a008_the_water_table() {
    let (_, r) = router("route-water.yaml");
    assert_eq!(lands(&r, "iot/water/w-7/location"), Some("water-location"));
    assert_eq!(
        lands(&r, "iot/water/w-7/location/gps"),
        Some("water-location")
    );
    assert_eq!(lands(&r, "iot/water/w-7/flow"), Some("water-measurement"));
    assert_eq!(
        lands(&r, "iot/water/w-7/flow/raw"),
        Some("water-measurement")
    );
    assert_eq!(
        lands(&r, "iot/weather/st-3/data"),
        Some("weather-measurement")
    );
    assert_eq!(
        lands(&r, "iot/weather/st-3/data/raw"),
        None,
        "that filter carries no #"
    );
    assert_eq!(
        lands(&r, "iot/weather/st-3/status"),
        None,
        "no filter matches it"
    );
    match r.resolve("iot/weather/st-3/events") {
        Route::Channel { filter, kind, .. } => {
            assert_eq!(filter, "iot/weather/+/events");
            assert_eq!(kind, ChannelType::Append);
        }
        Route::Broadcast => panic!("events is claimed"),
    }
}

/// A-010: a written `filter:` replaces `<name>/#`; the name claims nothing of its own.
#[test]
fn a_written_filter_replaces_the_default_name_filter_a010() {
    let (_, r) = router("route-water.yaml");
    for topic in [
        "water-location/x",
        "water-measurement/a/b",
        "inspections/x",
        "weather-measurement/data",
    ] {
        assert_eq!(lands(&r, topic), None, "{topic}");
    }
    assert_eq!(lands(&r, "iot/water/w-7/location"), Some("water-location"));
}

/// A-043, A-044, A-045, A-046: the first differing level decides, literal > `+` > `#`.
/// A-161: a publish goes to the most exact filter's channel (broadcast: a008).
#[test]
fn most_exact_rules_level_by_level() {
    let chans = |v: &[(&str, &str)]| {
        Router::from_channels(v.iter().enumerate().map(|(i, (n, f))| {
            (
                n.to_string(),
                ChannelType::Append,
                vec![f.to_string()],
                (i, false),
            )
        }))
    };
    // A spelled-out level beats +, which beats #.
    let r = chans(&[("hash", "a/#"), ("plus", "a/+"), ("lit", "a/b")]);
    assert_eq!(lands(&r, "a/b"), Some("lit"));
    assert_eq!(lands(&r, "a/c"), Some("plus"));
    assert_eq!(lands(&r, "a/c/d"), Some("hash"));
    // A filter that ends here beats one continuing with #.
    let r = chans(&[("deeper", "a/b/#"), ("ends", "a/b")]);
    assert_eq!(lands(&r, "a/b"), Some("ends"));
    assert_eq!(lands(&r, "a/b/c"), Some("deeper"));
    // The first differing level decides, whatever follows it.
    let r = chans(&[("x", "a/+/c/d"), ("y", "a/b/+/+")]);
    assert_eq!(lands(&r, "a/b/c/d"), Some("y"));
    // # matches the parent level too.
    let r = chans(&[("loc", "iot/+/location/#")]);
    assert_eq!(lands(&r, "iot/w/location"), Some("loc"));
}

/// A-048, B-131: routing ignores file order.
#[test]
fn b131_file_order_never_changes_an_answer() {
    let filters = [
        ("a", "x/+/z"),
        ("b", "x/y/#"),
        ("c", "x/+/+"),
        ("d", "x/#"),
        ("e", "x/y/z/#"),
    ];
    let forward = Router::from_channels(filters.iter().enumerate().map(|(i, (n, f))| {
        (
            n.to_string(),
            ChannelType::Append,
            vec![f.to_string()],
            (i, false),
        )
    }));
    let backward = Router::from_channels(filters.iter().rev().enumerate().map(|(i, (n, f))| {
        (
            n.to_string(),
            ChannelType::Append,
            vec![f.to_string()],
            (i, false),
        )
    }));
    for t in ["x/y/z", "x/q/z", "x/y", "x/y/z/w", "x", "x/q/q", "x/q/q/q"] {
        assert_eq!(forward.resolve(t), backward.resolve(t), "{t}");
    }
}

#[test]
fn what_a_filter_reaches_the_spec_table() {
    let (_, r) = router("route-water.yaml");
    let names = |f: &str| -> Vec<(String, Serves)> {
        r.reach(f)
            .channels
            .iter()
            .map(|t| (t.name.to_string(), t.serves))
            .collect()
    };
    assert_eq!(
        names("iot/water/w-7/location"),
        [("water-location".into(), Serves::Current)]
    );
    assert_eq!(
        names("iot/water/+/location/#"),
        [("water-location".into(), Serves::Current)]
    );
    assert_eq!(
        names("iot/water/w-7/#"),
        [
            ("water-location".into(), Serves::Current),
            ("water-measurement".into(), Serves::Replayed),
            ("inspections".into(), Serves::Excluded),
            ("inspections__dlq".into(), Serves::Replayed),
        ]
    );
    assert!(names("iot/weather/st-3/data/raw").is_empty());
    assert!(r.reach("iot/weather/st-3/data/raw").broadcast);
    assert_eq!(names("#").len(), 5);
}

/// A-106, A-112: the queue's own filter and one inside it are refused; a crossing one is not.
/// A-220: the dead-letter filter is more exact, so a plain filter on it is not 0x8F.
#[test]
fn a_plain_filter_inside_a_queue_is_refused_0x8f_and_a_crossing_one_is_not() {
    let (_, r) = router("route-water.yaml");
    assert_eq!(
        r.reach("iot/water/+/inspect").refused_inside_queue,
        Some("inspections")
    );
    assert_eq!(
        r.reach("iot/water/w-7/inspect").refused_inside_queue,
        Some("inspections")
    );
    assert_eq!(r.reach("#").refused_inside_queue, None);
    assert_eq!(r.reach("iot/#").refused_inside_queue, None);
    // The dead-letter channel's topics are its own (the more exact filter).
    assert_eq!(
        r.reach("iot/water/+/inspect/__dlq").refused_inside_queue,
        None
    );
}

/// B-349, B-350, B-351: the header and four columns, input first; a topic's type and
/// claiming filter or `-`/broadcast/`-`; a filter's replayed/current/excluded, __dlq too.
/// A-072: what a filter would be served, answered with nobody subscribed.
#[test]
fn b347_b351_the_depot_table_golden() {
    let (_, r) = router("route-depot.yaml");
    let subjects: Vec<String> = [
        "iot/depot/events/order-1",
        "iot/depot/state/device-1",
        "iot/depot/health/device-1",
        "iot/depot/#",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let want = "# topic-or-filter\tchannel\ttype\twhy
iot/depot/events/order-1\tevents\tappend\tiot/+/events/+
iot/depot/state/device-1\tstate\tlatest\tiot/+/state/+
iot/depot/health/device-1\t-\tbroadcast\t-
iot/depot/#\tevents\tappend\treplayed
iot/depot/#\tpresence\tlatest\tcurrent
iot/depot/#\tstate\tlatest\tcurrent
iot/depot/#\tjobs\tqueue\texcluded
iot/depot/#\tjobs__dlq\tappend\treplayed
";
    assert_eq!(routing::explain(&r, &subjects), want);
}

#[test]
fn b353_json_one_object_per_line_null_for_dash() {
    let (_, r) = router("route-depot.yaml");
    let subjects = routing::read_subjects("iot/depot/state/device-1\niot/depot/health/device-1\n");
    assert_eq!(
        routing::explain_json(&r, &subjects),
        "{\"subject\":\"iot/depot/state/device-1\",\"channel\":\"state\",\"type\":\"latest\",\"why\":\"iot/+/state/+\"}\n{\"subject\":\"iot/depot/health/device-1\",\"channel\":null,\"type\":\"broadcast\",\"why\":null}\n"
    );
}

/// B-352: blank lines and `#…` comments skipped; a bare `#` is a filter.
#[test]
fn b352_input_skips_blanks_and_comments_but_answers_a_bare_hash() {
    let subjects = routing::read_subjects(
        "# topic-or-filter\tchannel\ttype\twhy\n\n#\n# a note\niot/x\tevents\n",
    );
    assert_eq!(subjects, ["#", "iot/x"]);
}

/// A-020: the routing table lists every filter's expanded plain forms.
#[test]
fn a020_the_routing_table_prints_expanded_filters() {
    let (_, r) = router("route-water.yaml");
    let one = routing::explain_one(&r, "iot/weather/st-3/data");
    assert!(
        one.contains("iot/weather/+/data\tweather-measurement\tappend"),
        "{one}"
    );
    assert!(
        one.contains("iot/weather/+/events\tweather-measurement\tappend"),
        "{one}"
    );
    assert!(
        one.contains("iot/water/+/inspect/__dlq\tinspections__dlq\tappend"),
        "{one}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&routing::explain_one_json(&r, "iot/weather/st-3/data")).unwrap();
    assert_eq!(json["channel"], "weather-measurement");
    assert!(json["table"].as_array().unwrap().len() >= 5);
}

#[test]
fn b397_check_config_says_where_each_bridge_rule_lands() {
    let (c, _) = router("bridges.yaml");
    let s = config::summary(&c);
    assert!(
        s.contains(
            "bridge \"head-office\", in \"fleet/+/telemetry/#\": lands in readings (append)"
        ),
        "{s}"
    );
    assert!(
        s.contains("bridge \"head-office\", both \"alerts/#\": lands in alerts (latest)"),
        "{s}"
    );
}

/// `cargo test --release --test config_route -- --ignored --nocapture` prints ns per resolution.
#[test]
#[ignore]
fn bench_resolve_with_10000_channels() {
    let mut chans = Vec::new();
    for i in 0..10_000 {
        let f = match i % 4 {
            0 => format!("site-{}/+/events/#", i),
            1 => format!("site-{}/+/state/+", i),
            2 => format!("fleet/{}/+/telemetry", i),
            _ => format!("fleet/{}/jobs/#", i),
        };
        chans.push((format!("ch-{i}"), ChannelType::Append, vec![f], (i, false)));
    }
    let r = Router::from_channels(chans);
    let topics: Vec<String> = (0..1000)
        .map(|i| {
            let j = (i * 37 % 2500) * 4;
            match i % 5 {
                0 => format!("site-{j}/dev/events/x/y"),
                1 => format!("site-{}/dev/state/s", j + 1),
                2 => format!("fleet/{}/dev/telemetry", j + 2),
                3 => format!("fleet/{}/jobs/a/b/c", j + 3),
                _ => format!("fleet/{j}/unclaimed/x"),
            }
        })
        .collect();
    let rounds = 1000;
    let start = std::time::Instant::now();
    let mut hits = 0usize;
    for _ in 0..rounds {
        for t in &topics {
            if matches!(r.resolve(std::hint::black_box(t)), Route::Channel { .. }) {
                hits += 1;
            }
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / (rounds * topics.len()) as f64;
    println!("resolve with 10,000 channels: {ns:.0} ns per topic ({hits} hits)");
    let subs = [
        "site-400/dev-1/events/#",
        "fleet/402/+/telemetry",
        "fleet/+/dev/telemetry",
    ];
    let start = std::time::Instant::now();
    let n = 200;
    for _ in 0..n {
        for s in subs {
            std::hint::black_box(r.reach(std::hint::black_box(s)));
        }
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / (n * subs.len()) as f64;
    println!("reach (a SUBSCRIBE's filter) with 10,000 channels: {us:.1} us per filter");
    assert_eq!(hits, rounds * topics.len() * 4 / 5);
}

/// A tiny deterministic generator, so the comparison below is repeatable.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Every topic of up to `depth` levels over `alphabet`.
fn topics(alphabet: &[&str], depth: usize) -> Vec<String> {
    let mut all: Vec<String> = alphabet.iter().map(|s| s.to_string()).collect();
    let mut layer = all.clone();
    for _ in 1..depth {
        layer = layer
            .iter()
            .flat_map(|t| alphabet.iter().map(move |a| format!("{t}/{a}")))
            .collect();
        all.extend(layer.iter().cloned());
    }
    all
}

#[test]
fn reach_agrees_with_resolving_every_topic_the_filter_matches() {
    // Ground truth: a filter touches exactly the channels that hold some topic
    // it matches. Topics are enumerated over the filters' own levels plus one
    // level no filter spells (z), deep enough for every # to matter.
    let mut rng = Lcg(7);
    let level = |rng: &mut Lcg, first: bool| -> &'static str {
        match rng.next(if first { 2 } else { 4 }) {
            0 => "a",
            1 => "b",
            2 => "+",
            _ => "#",
        }
    };
    let make = |rng: &mut Lcg, first_literal: bool| -> String {
        let n = 1 + rng.next(3) as usize;
        let mut v: Vec<&str> = Vec::new();
        for i in 0..n {
            let l = level(rng, first_literal && i == 0);
            v.push(l);
            if l == "#" {
                break;
            }
        }
        v.join("/")
    };
    let all = topics(&["a", "b", "z"], 5);
    for round in 0..300 {
        let mut filters: Vec<String> = Vec::new();
        for _ in 0..1 + rng.next(6) {
            let f = make(&mut rng, true);
            if !filters.contains(&f) {
                filters.push(f);
            }
        }
        let kinds = [ChannelType::Append, ChannelType::Latest, ChannelType::Queue];
        let r = Router::from_channels(
            filters
                .iter()
                .enumerate()
                .map(|(i, f)| (format!("c{i}"), kinds[i % 3], vec![f.clone()], (i, false))),
        );
        for _ in 0..10 {
            let sub = make(&mut rng, false);
            let mut want: Vec<String> = Vec::new();
            let mut broadcast = false;
            for t in all.iter().filter(|t| routing::filter::matches(&sub, t)) {
                match r.resolve(t) {
                    Route::Channel { name, .. } => {
                        if !want.iter().any(|w| w == name) {
                            want.push(name.to_string());
                        }
                    }
                    Route::Broadcast => broadcast = true,
                }
            }
            want.sort_by_key(|n| n[1..].parse::<usize>().unwrap());
            let reach = r.reach(&sub);
            let got: Vec<String> = reach.channels.iter().map(|t| t.name.to_string()).collect();
            assert_eq!(got, want, "round {round}: {sub:?} against {filters:?}");
            assert_eq!(
                reach.broadcast, broadcast,
                "round {round}: {sub:?} against {filters:?}"
            );
        }
    }
}

#[test]
fn reserved_and_shared_subjects_say_what_subscribe_would() {
    let (_, r) = router("route-depot.yaml");
    let subjects: Vec<String> = [
        "$SYS/#",
        "$saguin/queue/jobs",
        "$saguin/queue/events",
        "$SHARE/g/iot/#",
        "$share/g/iot/depot/#",
        "$share//x",
        "iot/depot/+/x/#/y",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = routing::explain(&r, &subjects);
    for want in [
        "$SYS/#\t-\trefused\t0x87",
        "$saguin/queue/jobs\tjobs\tqueue\tworker form",
        "$saguin/queue/events\t-\trefused\t0x8F",
        "$SHARE/g/iot/#\t-\trefused\t0x8F",
        "$share/g/iot/depot/#\tevents\tappend\tshared: new records only",
        "$share/g/iot/depot/#\tjobs\tqueue\texcluded",
        "$share//x\t-\trefused\t0x8F",
        "iot/depot/+/x/#/y\t-\trefused\t0x8F",
    ] {
        assert!(out.contains(want), "{want:?} not in\n{out}");
    }
}

/// B-349, B-350, B-352: `saguin --route FILE` reading its subjects on standard input
/// prints the header, then each subject first in four tab-separated columns; a
/// comment and a blank line are skipped.
#[test]
fn route_reads_its_subjects_on_standard_input_b349() {
    use std::io::Write;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config/route-depot.yaml");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_saguin"))
        .arg("--route")
        .arg(&path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run saguin");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"# a note\n\niot/depot/state/device-1\niot/depot/health/device-1\n")
        .expect("write the subjects");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("saguin --route exits")
        .expect("its output");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "# topic-or-filter\tchannel\ttype\twhy
iot/depot/state/device-1\tstate\tlatest\tiot/+/state/+
iot/depot/health/device-1\t-\tbroadcast\t-
"
    );
}

/// A-011: a filter holds no regular expression: `.*`, `(b|c)` and `[ab]` are literal
/// levels, matching only themselves; `{a,b}` is the one extension.
#[test]
fn a_channel_filter_holds_no_regular_expression_a011() {
    let yaml = "broker:
  id: regex
  storage:
    default: local
    default_retention_period: none
    default_retention_bytes: none
    providers:
      local:
        type: memory
        snapshot_dir: none
channels:
  dotstar:
    type: append
    filter: \"iot/.*/x\"
  alternation:
    type: append
    filter: \"a/(b|c)\"
  class:
    type: append
    filter: \"s/[ab]\"
  braces:
    type: append
    filter: \"b/{x,y}\"
";
    let c = config::from_str(yaml, Path::new("saguin.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let r = Router::new(&c);
    assert_eq!(lands(&r, "iot/.*/x"), Some("dotstar"));
    assert_eq!(lands(&r, "iot/abc/x"), None);
    assert_eq!(lands(&r, "a/(b|c)"), Some("alternation"));
    assert_eq!(lands(&r, "a/b"), None);
    assert_eq!(lands(&r, "s/[ab]"), Some("class"));
    assert_eq!(lands(&r, "s/a"), None);
    assert_eq!(lands(&r, "b/x"), Some("braces"));
    assert_eq!(lands(&r, "b/y"), Some("braces"));
    assert_eq!(lands(&r, "b/{x,y}"), None);
}

/// A-015: no brace survives the loader: the router holds only plain filters, and a
/// subscription spelling the braces is the literal level it is, reaching no channel.
#[test]
fn no_brace_survives_past_the_loader_a015() {
    let (c, r) = router("route-water.yaml");
    for (name, _, filters) in r.channels() {
        for f in filters {
            assert!(!f.contains(['{', '}']), "{name}: {f}");
        }
    }
    let weather = c
        .channels
        .iter()
        .find(|ch| ch.name == "weather-measurement")
        .expect("the channel");
    assert_eq!(
        weather.filters,
        ["iot/weather/+/data", "iot/weather/+/events"]
    );
    assert_eq!(lands(&r, "iot/weather/st-3/{data,events}"), None);
    let reach = r.reach("iot/weather/+/{data,events}");
    assert!(reach.channels.is_empty() && reach.broadcast);
}

/// The standard output of `saguin ARGS`, which must exit 0.
fn saguin_output(args: &[&str]) -> String {
    let out = common::run_saguin(args);
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// B-348: `--route` answers as the running broker routes: each topic published to a
/// broker on the same file lands in the channel `--route` names (each published a
/// different power of two times, so the channels' record counts say which went where),
/// and one it calls broadcast lands in none.
#[test]
fn route_agrees_with_where_the_running_broker_stores_b348() {
    let dir = common::temp_dir("route-agrees");
    let channels = [
        ("a", "x/+/z"),
        ("b", "x/y/#"),
        ("c", "x/+/+/#"),
        ("d", "x/#"),
    ];
    let mut yaml = common::config(
        "  operations:\n    listen:\n      unix:\n        path: {dir}/ops.sock\nchannels:\n",
    );
    for (name, filter) in channels {
        yaml.push_str(&format!(
            "  {name}:\n    type: append\n    filter: {filter}\n"
        ));
    }
    let path = dir.join("route.yaml");
    std::fs::write(&path, yaml.replace("{dir}", &dir.display().to_string())).unwrap();
    let path = path.to_str().expect("UTF-8 path").to_string();
    let topics = [
        "x/y/z", "x/q/z", "x/y", "x/y/z/w", "x/q/q/q", "x", "other/t",
    ];
    let mut want = std::collections::BTreeMap::new();
    for (i, topic) in topics.iter().enumerate() {
        let out = saguin_output(&["--route", &path, topic]);
        let line = out.lines().nth(1).expect("the answer line");
        let channel = line
            .split('\t')
            .nth(1)
            .expect("a channel column")
            .to_string();
        *want.entry(channel).or_insert(0u64) += 1 << i;
    }
    assert!(
        want.len() >= 4,
        "the subjects reach several channels: {want:?}"
    );
    let broker = common::Broker::start_in(dir, &yaml);
    let mut publisher = common::Raw::connected(broker.addr, V5, "publisher");
    for (i, topic) in topics.iter().enumerate() {
        for _ in 0..1u64 << i {
            assert_eq!(
                publisher.publish(topic, b"r", QoS::AtLeastOnce, false),
                Some(0)
            );
        }
    }
    for (name, _) in channels {
        let n = want.get(name).copied().unwrap_or(0);
        broker.assert_metric(&format!("saguin_channel_records{{channel=\"{name}\"}} {n}"));
    }
    assert!(want.contains_key("-"), "one topic is broadcast: {want:?}");
}

/// B-354: `--route FILE SUBJECT --json` prints one object carrying the answer and
/// the routing table the paragraph form prints, row for row.
#[test]
fn route_json_for_one_subject_carries_the_paragraph_forms_table_b354() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config/route-depot.yaml");
    let path = path.to_str().expect("UTF-8 path");
    for subject in ["iot/depot/events/o-1", "iot/depot/#"] {
        let text = saguin_output(&["--route", path, subject]);
        let (answers, table) = text.split_once("\n\n").expect("answer, blank line, table");
        let json = saguin_output(&["--route", path, subject, "--json"]);
        assert!(
            json.ends_with("}\n") && json.lines().count() == 1,
            "one object, one line: {json:?}"
        );
        let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(v["subject"], subject);
        let rows: Vec<String> = v["table"]
            .as_array()
            .expect("a table")
            .iter()
            .map(|r| {
                format!(
                    "{}\t{}\t{}",
                    r["filter"].as_str().unwrap(),
                    r["channel"].as_str().unwrap(),
                    r["type"].as_str().unwrap()
                )
            })
            .collect();
        let printed: Vec<&str> = table.lines().skip(1).collect();
        assert_eq!(rows, printed, "{subject}");
        let said: Vec<String> = v["answers"]
            .as_array()
            .expect("answers")
            .iter()
            .map(|a| {
                let s = |k: &str| a[k].as_str().unwrap_or("-").to_string();
                format!("{subject}\t{}\t{}\t{}", s("channel"), s("type"), s("why"))
            })
            .collect();
        let printed: Vec<&str> = answers.lines().skip(1).collect();
        assert_eq!(said, printed, "{subject}");
    }
}

/// A-056: `saguin --route FILE TOPIC` names the channel a topic routes to, for an
/// append, a latest and a queue channel, or says broadcast.
#[test]
fn route_names_the_channel_of_a_topic_of_every_type_a056() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config/route-depot.yaml");
    for (topic, want) in [
        ("iot/depot/events/o-1", "\tevents\tappend\tiot/+/events/+"),
        ("iot/depot/state/d-1", "\tstate\tlatest\tiot/+/state/+"),
        ("iot/depot/jobs/j-1", "\tjobs\tqueue\tiot/+/jobs/+"),
        ("iot/depot/health/d-1", "\t-\tbroadcast\t-"),
    ] {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_saguin"))
            .arg("--route")
            .arg(&path)
            .arg(topic)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run saguin");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let out = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("saguin --route exits")
            .expect("its output");
        assert!(out.status.success(), "{topic}: {out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = format!("\n{topic}{want}\n");
        assert!(stdout.contains(&line), "{line:?} not in\n{stdout}");
    }
}

/// B-348: `--route` answers as the broker does: a channel's seek reply topic is
/// subscribable (A-201), and a group's inner filter is reserved only when its first
/// level is `$SYS` or `$saguin`, not when it merely begins so.
#[test]
fn b348_route_agrees_with_the_broker_on_the_reserved_space() {
    let (_, r) = router("route-water.yaml");
    let reply = routing::explain_one(&r, "$saguin/consumer/anything/seek/reply");
    assert!(!reply.contains("refused"), "{reply}");
    assert!(reply.contains("\treply\t"), "{reply}");
    let system = routing::explain_one(&r, "$share/g/$SYSTEM/x");
    assert!(!system.contains("refused"), "{system}");
    let sys = routing::explain_one(&r, "$share/g/$SYS/x");
    assert!(sys.contains("refused\t0x87"), "{sys}");
    // The broker itself, on the same subjects.
    let broker = common::Broker::start("");
    let mut c = common::Raw::connected(broker.addr, V5, "asker");
    for (filter, code) in [
        ("$saguin/consumer/anything/seek/reply", 0),
        ("$share/g/$SYSTEM/x", 0),
        ("$share/g/$SYS/x", 0x87),
    ] {
        assert_eq!(
            c.subscribe(filter, common::opts(QoS::AtMostOnce)),
            [code],
            "{filter}"
        );
    }
}
