//! Stock clients cannot tell Sagüin from a good broker: rumqttc (MQTT 3.1.1 and 5)
//! and, where Debian's mosquitto-clients are installed, mosquitto_pub / mosquitto_sub.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

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
        let sub = Command::new("timeout")
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
        std::thread::sleep(Duration::from_millis(500));
        publish("live-value", false);
        let out = sub.wait_with_output().expect("mosquitto_sub output");
        assert!(out.status.success(), "mosquitto_sub exit {:?}", out.status);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text,
            format!("{topic} retained-value\n{topic} live-value\n")
        );
    }
}
