//! Stock clients cannot tell Sagüin from a good broker: rumqttc (MQTT 3.1.1 and 5)
//! and, where Debian's mosquitto-clients are installed, mosquitto_pub / mosquitto_sub;
//! where python3-paho-mqtt is installed, the Paho Python client as Home Assistant
//! uses it (`tests/interop/paho_check.py`).

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Broker;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

#[test]
fn rumqttc_v4_publishes_and_subscribes_at_every_qos() {
    use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
    let broker = Broker::start("");
    runtime().block_on(async {
        let mut opts =
            MqttOptions::new("rumq-v4", broker.addr.ip().to_string(), broker.addr.port());
        opts.set_keep_alive(Duration::from_secs(5));
        let (client, mut events) = AsyncClient::new(opts, 16);
        client
            .subscribe("v4/#", QoS::ExactlyOnce)
            .await
            .expect("subscribe");
        for (i, qos) in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce]
            .into_iter()
            .enumerate()
        {
            client
                .publish(format!("v4/{i}"), qos, false, format!("m{i}"))
                .await
                .expect("publish");
        }
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + common::WAIT;
        while got.len() < 3 {
            let event = tokio::time::timeout_at(deadline, events.poll())
                .await
                .expect("in time")
                .expect("event");
            if let Event::Incoming(Packet::Publish(p)) = event {
                got.push((p.topic.clone(), p.qos, p.payload.to_vec()));
            }
        }
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            got[0],
            ("v4/0".to_string(), QoS::AtMostOnce, b"m0".to_vec())
        );
        assert_eq!(
            got[1],
            ("v4/1".to_string(), QoS::AtLeastOnce, b"m1".to_vec())
        );
        assert_eq!(
            got[2],
            ("v4/2".to_string(), QoS::ExactlyOnce, b"m2".to_vec())
        );
    });
}

#[test]
fn rumqttc_v5_carries_properties_end_to_end() {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};
    let broker = Broker::start("");
    runtime().block_on(async {
        let opts = MqttOptions::new("rumq-v5", broker.addr.ip().to_string(), broker.addr.port());
        let (client, mut events) = AsyncClient::new(opts, 16);
        client
            .subscribe("v5/props", QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        let props = PublishProperties {
            response_topic: Some("v5/reply".into()),
            correlation_data: Some(b"corr".to_vec().into()),
            user_properties: vec![("k".into(), "v".into())],
            content_type: Some("text/plain".into()),
            ..PublishProperties::default()
        };
        client
            .publish_with_properties("v5/props", QoS::AtLeastOnce, false, "hello", props)
            .await
            .expect("publish");
        let deadline = tokio::time::Instant::now() + common::WAIT;
        loop {
            let event = tokio::time::timeout_at(deadline, events.poll())
                .await
                .expect("in time")
                .expect("event");
            if let Event::Incoming(Packet::Publish(p)) = event {
                let props = p.properties.expect("properties");
                assert_eq!(&p.payload[..], b"hello");
                assert_eq!(props.response_topic.as_deref(), Some("v5/reply"));
                assert_eq!(props.correlation_data.as_deref(), Some(&b"corr"[..]));
                assert_eq!(props.content_type.as_deref(), Some("text/plain"));
                assert_eq!(
                    props.user_properties,
                    vec![("k".to_string(), "v".to_string())]
                );
                break;
            }
        }
    });
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--help")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

#[test]
fn mosquitto_pub_and_sub_interoperate_when_installed() {
    if !have("mosquitto_sub") || !have("mosquitto_pub") {
        eprintln!("mosquitto-clients not installed: skipped (CI installs them)");
        return;
    }
    let broker = Broker::start("");
    let port = broker.addr.port().to_string();
    for version in ["mqttv311", "mqttv5"] {
        let topic = format!("interop/{version}");
        let publish = |payload: &str, retain: bool| {
            let mut cmd = Command::new("mosquitto_pub");
            cmd.args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-V",
                version,
                "-q",
                "1",
                "-t",
                &topic,
                "-m",
                payload,
            ]);
            if retain {
                cmd.arg("-r");
            }
            assert!(cmd.status().expect("mosquitto_pub runs").success());
        };
        publish("retained-value", true);
        let mut sub = Command::new("timeout")
            .args([
                "10",
                "mosquitto_sub",
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-V",
                version,
                "-q",
                "2",
                "-t",
                &topic,
                "-C",
                "2",
                "-v",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("mosquitto_sub runs");
        // The retained value printed means the subscription is in place: the live
        // one is published then, not after a sleep a slow start can outrun.
        let mut lines = std::io::BufReader::new(sub.stdout.take().expect("piped stdout"));
        let mut first = String::new();
        std::io::BufRead::read_line(&mut lines, &mut first).expect("mosquitto_sub prints");
        assert_eq!(first, format!("{topic} retained-value\n"));
        publish("live-value", false);
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut lines, &mut rest).expect("mosquitto_sub prints");
        let status = sub.wait().expect("mosquitto_sub exits");
        assert!(status.success(), "mosquitto_sub exit {status:?}");
        assert_eq!(rest, format!("{topic} live-value\n"));
    }
}

/// The first Python that imports paho-mqtt: `python3` on PATH, else Debian's
/// `/usr/bin/python3`, where python3-paho-mqtt installs when PATH leads elsewhere
/// (a pyenv, say).
fn python_with_paho() -> Option<&'static str> {
    ["python3", "/usr/bin/python3"].into_iter().find(|python| {
        Command::new(python)
            .args(["-c", "import paho.mqtt.client"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Home Assistant's MQTT integration is built on paho-mqtt. The script checks, in
/// MQTT 3.1.1 and 5, what it does: a retained QoS 1 Will on an availability topic,
/// a retained birth message and retained discovery configs under `homeassistant/`
/// that a later wildcard subscriber gets flagged retained (A-194, B-427; live to
/// current subscribers, B-428), a zero-length retained publish clearing the value
/// (B-426), the Will published when the connection drops without DISCONNECT (C-248,
/// C-268) and not after a clean DISCONNECT (C-284), QoS 0/1/2 delivered in order at
/// the granted QoS, UNSUBSCRIBE stopping delivery, a persistent session resuming
/// with what was published while it was away (A-037, B-080); in MQTT 5 also User
/// Properties, Response Topic, Correlation Data, Content Type and Message Expiry
/// Interval end to end, and No Local.
#[test]
fn paho_python_client_works_as_home_assistant_uses_it() {
    let Some(python) = python_with_paho() else {
        eprintln!("python3-paho-mqtt not installed: skipped (CI installs it)");
        return;
    };
    let broker = Broker::start("");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/paho_check.py");
    let mut child = Command::new(python)
        .args([script, "--port", &broker.addr.port().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python runs");
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("stdout")));
    let stderr = read(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the script") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = format!(
        "{}{}",
        stdout.join().unwrap_or_default(),
        stderr.join().unwrap_or_default()
    );
    match status {
        None => panic!("paho_check.py still running after 60 s, killed:\n{output}"),
        Some(status) => assert!(status.success(), "paho_check.py exited {status}:\n{output}"),
    }
    eprint!("{output}");
}
