//! The shipped `examples/saguin.yaml` works as it is: it validates, and a broker on it
//! (its ports moved to ephemeral ones and its storage to a temp dir, so tests may run
//! beside a broker a developer started on it) serves each channel type and every door.

mod common;

use common::{Broker, Raw, opts, temp_dir};
use saguin::codec::{ProtocolVersion::V311, QoS};

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/saguin.yaml");

#[test]
fn the_example_configuration_validates() {
    let out = common::run_saguin(&["--check-config", EXAMPLE]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains(": ok"),
        "B-550: the answer is on stdout: {said}"
    );
    for channel in ["events", "state", "jobs"] {
        assert!(said.contains(channel), "{said}");
    }
}

#[test]
fn a_broker_on_the_example_serves_its_channels_and_doors() {
    let dir = temp_dir("example");
    let yaml = std::fs::read_to_string(EXAMPLE)
        .expect("the example")
        .replace("127.0.0.1:1883", "127.0.0.1:0")
        .replace("127.0.0.1:9001", "127.0.0.1:0")
        .replace("127.0.0.1:9090", "127.0.0.1:0")
        .replace("/tmp/saguin-example", &dir.display().to_string());
    let broker = Broker::start_in(dir, &yaml);
    broker.wait_log("listening on ws://");
    broker.wait_log("operations listening on http://");
    let mut client = Raw::connected(broker.addr, V311, "example");
    assert_eq!(
        client.publish("site/a/events/boot", b"hello", QoS::AtLeastOnce, false),
        Some(0)
    );
    let mut reader = Raw::connected(broker.addr, V311, "reader");
    reader.subscribe("site/+/events/#", opts(QoS::AtLeastOnce));
    assert_eq!(
        &*reader.recv_publish().payload,
        b"hello",
        "replayed from the floor"
    );
}

/// B-553: `--check-config` succeeds while a broker on the same configuration runs:
/// it takes no provider lock and binds no socket.
#[test]
fn check_config_succeeds_beside_a_running_broker_b553() {
    let dir = common::temp_dir("check-beside");
    let yaml = common::CHANNELS.replace("{dir}", &dir.display().to_string());
    std::fs::create_dir_all(dir.join("snapshots")).expect("snapshot dir");
    let broker = common::Broker::start_in(dir.clone(), &yaml);
    let out = common::run_saguin(&[
        "--check-config".as_ref(),
        dir.join("saguin.yaml").as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(broker);
}
