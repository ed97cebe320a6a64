//! RFC 0002 "Validation", one case per rule: each invalid case names the
//! requirement it pins (req-0002a/b IDs), the key the finding must name and
//! the line it must name (found by a marker in the text, so the table reads
//! as YAML). Each rule also has a valid neighbour that must load.

use std::path::Path;

#[path = "common/mutate.rs"]
mod mutate;

use saguin::config::{self, Config, ConfigError};

/// Ten lines every case starts from: an id and one sqlite provider.
const BASE: &str = "broker:
  id: edge-1
  storage:
    default: local
    default_retention_period: 3d
    default_retention_bytes: none
    providers:
      local:
        type: sqlite
        file_path: /var/lib/saguin/saguin.db
";

fn load(suffix: &str) -> (String, Result<Config, ConfigError>) {
    let text = format!("{BASE}{suffix}");
    let r = config::from_str(&text, Path::new("saguin.yaml"));
    (text, r)
}

/// The 1-based line of the first line containing `marker`, past BASE.
fn line_of(text: &str, marker: &str) -> u32 {
    let skip = BASE.lines().count();
    text.lines()
        .enumerate()
        .skip(skip)
        .find(|(_, l)| l.contains(marker))
        .map(|(i, _)| i as u32 + 1)
        .unwrap_or_else(|| panic!("marker {marker:?} not in\n{text}"))
}

/// (requirement, YAML after BASE, key the finding names, marker of its line)
const INVALID: &[(&str, &str, &str, &str)] = &[
    // Channel names (A-023 … A-028: no key lifts the 128-byte limit; B-482, B-491).
    (
        "A-023",
        "channels:\n  a/b:\n    type: append\n",
        "channels.a/b",
        "a/b:",
    ),
    (
        "A-023",
        "channels:\n  \"a b\":\n    type: append\n",
        "channels.a b",
        "\"a b\":",
    ),
    (
        "A-024",
        "channels:\n  \"..\":\n    type: append\n    filter: x/#\n",
        "channels...",
        "\"..\":",
    ),
    (
        "A-025",
        "channels:\n  \"\":\n    type: append\n    filter: x/#\n",
        "channels.",
        "\"\":",
    ),
    (
        "A-026",
        "channels:\n  aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa:\n    type: append\n",
        "channels.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "aaaa:",
    ),
    (
        "A-028",
        "  limits:\n    max_channel_name_length: 256\n",
        "broker.limits.max_channel_name_length",
        "max_channel_name_length:",
    ),
    (
        "A-027",
        "channels:\n  jobs__dlq:\n    type: append\n",
        "channels.jobs__dlq",
        "jobs__dlq:",
    ),
    (
        "B-491",
        "channels:\n  a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a:\n    type: append\n    filter: x/#\n",
        "channels.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a",
        "a.a.a",
    ),
    // Types (B-010; A-003: there is no `broadcast` to configure).
    (
        "B-010",
        "channels:\n  x:\n    type: broadcast\n",
        "channels.x.type",
        "type: broadcast",
    ),
    (
        "A-003",
        "broadcast:\n  enabled: false\n",
        "broadcast",
        "broadcast:",
    ),
    (
        "B-009",
        "channels:\n  x:\n    filter: x/#\n",
        "channels.x.type",
        "  x:",
    ),
    // Filters (A-016 … A-022, B-483 … B-490, B-108).
    (
        "B-483",
        "channels:\n  x:\n    type: append\n    filter: a/#/b\n",
        "channels.x.filter",
        "filter:",
    ),
    (
        "B-483",
        "channels:\n  x:\n    type: append\n    filter: \"a/b\\0\"\n",
        "channels.x.filter",
        "filter:",
    ),
    (
        "B-483",
        "channels:\n  x:\n    type: append\n    filter: a/b+\n",
        "channels.x.filter",
        "filter:",
    ),
    (
        "B-485",
        "channels:\n  x:\n    type: append\n    filter: +/x\n",
        "channels.x.filter",
        "filter:",
    ),
    (
        "B-485",
        "channels:\n  x:\n    type: append\n    filter: \"#\"\n",
        "channels.x.filter",
        "filter:",
    ),
    (
        "B-485",
        "channels:\n  x:\n    type: append\n    filter: $SYS/x\n",
        "channels.x.filter",
        "filter:",
    ),
    (
        "B-486",
        "channels:\n  a:\n    type: append\n    filter: x/{a,b}\n  b:\n    type: latest\n    filter: x/b\n",
        "channels.b.filter",
        "  b:",
    ),
    // an operator's filter with a `__dlq` level is refused at startup.
    (
        "B-487",
        "channels:\n  x:\n    type: append\n    filter: a/__dlq/b\n",
        "channels.x.filter",
        "filter:",
    ),
    (
        "A-022",
        "channels:\n  x:\n    type: queue\n    filter: a/{b,c}\n",
        "channels.x.filter",
        "filter:",
    ),
    (
        "A-016",
        "channels:\n  x:\n    type: append\n    filter: a/{b/c,d}\n",
        "channels.x.filter",
        "filter:",
    ),
    (
        "A-017",
        "channels:\n  x:\n    type: append\n    filter: a/{}\n",
        "channels.x.filter",
        "filter:",
    ),
    (
        "A-018",
        "channels:\n  x:\n    type: append\n    filter: a/{b,}\n",
        "channels.x.filter",
        "filter:",
    ),
    (
        "B-490",
        "  limits:\n    max_topic_length: 5\nchannels:\n  x:\n    type: append\n    filter: abcde/#\n",
        "channels.x.filter",
        "filter:",
    ),
    (
        "B-484",
        "  limits:\n    max_topic_length: 3\nchannels:\n  xyz:\n    type: append\n",
        "channels.xyz.filter",
        "  xyz:",
    ),
    (
        "B-108",
        "  limits:\n    max_topic_levels: 2\nchannels:\n  x:\n    type: append\n    filter: a/b/c\n",
        "channels.x.filter",
        "filter:",
    ),
    // Keys per type (B-494, B-495, B-507, B-414; A-090: a latest channel has no size bound).
    (
        "B-494",
        "channels:\n  x:\n    type: latest\n    retention_bytes: 1GiB\n",
        "channels.x.retention_bytes",
        "retention_bytes",
    ),
    (
        "B-494",
        "channels:\n  x:\n    type: latest\n    max_bytes: 1GiB\n",
        "channels.x.max_bytes",
        "max_bytes",
    ),
    (
        "B-494",
        "channels:\n  x:\n    type: queue\n    retention_period: 1d\n",
        "channels.x.retention_period",
        "retention_period",
    ),
    (
        "B-494",
        "channels:\n  x:\n    type: queue\n    retention_bytes: 1GiB\n",
        "channels.x.retention_bytes",
        "retention_bytes",
    ),
    (
        "B-495",
        "channels:\n  x:\n    type: append\n    dlq_retention_period: 1d\n",
        "channels.x.dlq_retention_period",
        "dlq_retention_period",
    ),
    (
        "B-495",
        "channels:\n  x:\n    type: latest\n    dlq_retention_bytes: 1GiB\n",
        "channels.x.dlq_retention_bytes",
        "dlq_retention_bytes",
    ),
    (
        "B-507",
        "channels:\n  x:\n    type: append\n    visibility_timeout: 30s\n",
        "channels.x.visibility_timeout",
        "visibility_timeout",
    ),
    (
        "B-507",
        "channels:\n  x:\n    type: latest\n    job_expires_after: 1h\n",
        "channels.x.job_expires_after",
        "job_expires_after",
    ),
    (
        "B-507",
        "channels:\n  x:\n    type: append\n    retry:\n      max_attempts: 3\n",
        "channels.x.retry",
        "retry:",
    ),
    (
        "B-414",
        "channels:\n  x:\n    type: latest\n    start: tail\n",
        "channels.x.start",
        "start:",
    ),
    (
        "B-414",
        "channels:\n  x:\n    type: queue\n    start: tail\n",
        "channels.x.start",
        "start:",
    ),
    (
        "B-413",
        "channels:\n  x:\n    type: append\n    start: head\n",
        "channels.x.start",
        "start:",
    ),
    (
        "A-093",
        "channels:\n  x:\n    type: append\n    deletion_retention_period: 1d\n",
        "channels.x.deletion_retention_period",
        "deletion_retention_period",
    ),
    (
        "A-093",
        "channels:\n  x:\n    type: queue\n    deletion_retention_period: 1d\n",
        "channels.x.deletion_retention_period",
        "deletion_retention_period",
    ),
    // Storage names and retention values (B-492, B-493, B-496, B-497).
    (
        "B-493",
        "channels:\n  x:\n    type: append\n    storage: nowhere\n",
        "channels.x.storage",
        "storage:",
    ),
    (
        "B-493",
        "  retained:\n    storage: nowhere\n",
        "broker.retained.storage",
        "storage: nowhere",
    ),
    (
        "B-493",
        "  session:\n    storage: nowhere\n",
        "broker.session.storage",
        "storage: nowhere",
    ),
    (
        "B-497",
        "channels:\n  x:\n    type: append\n    retention_period: 0s\n",
        "channels.x.retention_period",
        "retention_period",
    ),
    (
        "B-497",
        "channels:\n  x:\n    type: append\n    retention_bytes: 0\n",
        "channels.x.retention_bytes",
        "retention_bytes",
    ),
    (
        "B-518",
        "channels:\n  x:\n    type: append\n    retention_period: 500ms\n",
        "channels.x.retention_period",
        "retention_period",
    ),
    // Providers (B-498, B-499, B-501, B-503, B-144 … B-158).
    // C-116: a max_bytes below twice the reserve is a startup error.
    (
        "B-498",
        "      mem:\n        type: memory\n        max_bytes: 1MiB\n        snapshot_dir: none\n",
        "broker.storage.providers.mem.max_bytes",
        "max_bytes",
    ),
    (
        "B-499",
        "      db:\n        type: sqlite\n        file_path: /var/lib/saguin/db2.db\n        max_bytes: 2MiB\n",
        "broker.storage.providers.db.max_bytes",
        "max_bytes",
    ),
    (
        "B-501",
        "      db:\n        type: sqlite\n",
        "broker.storage.providers.db.file_path",
        "      db:",
    ),
    (
        "B-501",
        "      mem:\n        type: memory\n",
        "broker.storage.providers.mem.snapshot_dir",
        "      mem:",
    ),
    (
        "B-501",
        "      mem:\n        type: memory\n        snapshot_dir: none\n        file_path: /x.db\n",
        "broker.storage.providers.mem.file_path",
        "file_path: /x.db",
    ),
    (
        "B-501",
        "      db:\n        type: sqlite\n        file_path: /y.db\n        snapshot_dir: /snap\n",
        "broker.storage.providers.db.snapshot_dir",
        "snapshot_dir",
    ),
    (
        "B-503",
        "      db:\n        type: sqlite\n        file_path: data/x.db\n",
        "broker.storage.providers.db.file_path",
        "file_path: data",
    ),
    (
        "B-503",
        "      mem:\n        type: memory\n        snapshot_dir: snaps\n",
        "broker.storage.providers.mem.snapshot_dir",
        "snapshot_dir",
    ),
    (
        "B-007",
        "      db:\n        type: rocksdb\n",
        "broker.storage.providers.db.type",
        "rocksdb",
    ),
    (
        "B-144",
        "        publish_commit_interval: 2s\n        publish_commit_max_records: 8\n",
        "broker.storage.providers.local.publish_commit_interval",
        "publish_commit_interval",
    ),
    (
        "B-145",
        "        publish_commit_interval: 2ms\n        publish_commit_max_records: 1\n",
        "broker.storage.providers.local.publish_commit_max_records",
        "publish_commit_max_records",
    ),
    (
        "B-145",
        "        publish_commit_interval: 2ms\n        publish_commit_max_records: 20000\n",
        "broker.storage.providers.local.publish_commit_max_records",
        "publish_commit_max_records",
    ),
    (
        "B-146",
        "        publish_commit_interval: 2ms\n",
        "broker.storage.providers.local.publish_commit_max_records",
        "publish_commit_interval",
    ),
    (
        "B-146",
        "        publish_commit_max_records: 8\n",
        "broker.storage.providers.local.publish_commit_max_records",
        "publish_commit_max_records",
    ),
    (
        "B-147",
        "      mem:\n        type: memory\n        snapshot_dir: none\n        publish_commit_interval: 2ms\n",
        "broker.storage.providers.mem.publish_commit_interval",
        "publish_commit_interval",
    ),
    (
        "B-152",
        "        read_connections: 9\n",
        "broker.storage.providers.local.read_connections",
        "read_connections",
    ),
    (
        "B-152",
        "      mem:\n        type: memory\n        snapshot_dir: none\n        read_connections: 1\n",
        "broker.storage.providers.mem.read_connections",
        "read_connections",
    ),
    (
        "B-158",
        "        flush_interval: 5ms\n",
        "broker.storage.providers.local.flush_interval",
        "flush_interval",
    ),
    (
        "B-158",
        "        flush_interval: none\n",
        "broker.storage.providers.local.flush_interval",
        "flush_interval",
    ),
    (
        "B-158",
        "        flush_interval: 2s\n",
        "broker.storage.providers.local.flush_interval",
        "flush_interval",
    ),
    // Queues (B-508 … B-513).
    (
        "B-508",
        "channels:\n  q:\n    type: queue\n    visibility_timeout: 1h\n    job_expires_after: 30m\n",
        "channels.q.job_expires_after",
        "job_expires_after",
    ),
    (
        "B-508",
        "channels:\n  q:\n    type: queue\n    visibility_timeout: 0s\n",
        "channels.q.visibility_timeout",
        "visibility_timeout",
    ),
    (
        "B-509",
        "channels:\n  q:\n    type: queue\n    retry:\n      max_attempts: 0\n",
        "channels.q.retry.max_attempts",
        "max_attempts",
    ),
    (
        "B-512",
        "channels:\n  q:\n    type: queue\n    retry:\n      backoff: cubic\n      backoff_base: 2s\n",
        "channels.q.retry.backoff",
        "backoff: cubic",
    ),
    (
        "B-512",
        "channels:\n  q:\n    type: queue\n    retry:\n      backoff: linear\n      backoff_base: 500ms\n",
        "channels.q.retry.backoff_base",
        "backoff_base",
    ),
    (
        "B-513",
        "channels:\n  q:\n    type: queue\n    retry:\n      backoff: exponential\n",
        "channels.q.retry.backoff",
        "backoff:",
    ),
    (
        "B-513",
        "channels:\n  q:\n    type: queue\n    retry:\n      backoff_base: 2s\n",
        "channels.q.retry.backoff_base",
        "backoff_base",
    ),
    // Listeners (B-166 … B-235, B-514 … B-519).
    (
        "B-201",
        "  mqtt:\n    listen:\n      tcp:\n        address: :8883\n        tls:\n          cert_file: /c.pem\n          key_file: /k.pem\n          require_certificate: true\n",
        "broker.mqtt.listen.tcp.tls.require_certificate",
        "require_certificate",
    ),
    (
        "B-193",
        "  mqtt:\n    listen:\n      tcp:\n        address: :8883\n        tls:\n          cert_file: /c.pem\n          key_file: /k.pem\n          min_version: 1.1\n",
        "broker.mqtt.listen.tcp.tls.min_version",
        "min_version",
    ),
    (
        "B-166",
        "  mqtt:\n    listen:\n      ws:\n        address: :8083\n        allowed_origins:\n          - https://example.com/page\n",
        "broker.mqtt.listen.ws.allowed_origins[0]",
        "https://",
    ),
    // An entry the door could not read would be dropped, and an empty list admits
    // every page: refused here instead.
    (
        "B-166",
        "  mqtt:\n    listen:\n      ws:\n        address: :8083\n        same_origin: false\n        allowed_origins:\n          - https://dash.example.com:84433\n",
        "broker.mqtt.listen.ws.allowed_origins[0]",
        "84433",
    ),
    (
        "B-166",
        "  mqtt:\n    listen:\n      ws:\n        address: :8083\n        allowed_origins: [\"https://host:\", \"http://[::1\"]\n",
        "broker.mqtt.listen.ws.allowed_origins[0]",
        "allowed_origins",
    ),
    (
        "B-166",
        "  mqtt:\n    listen:\n      ws:\n        address: :8083\n        allowed_origins: [\"https://ok.example:8443\", \"http://[::1\"]\n",
        "broker.mqtt.listen.ws.allowed_origins[1]",
        "allowed_origins",
    ),
    (
        "B-166",
        "  mqtt:\n    listen:\n      ws:\n        address: :8083\n        allowed_origins: [\"null\"]\n",
        "broker.mqtt.listen.ws.allowed_origins[0]",
        "allowed_origins",
    ),
    (
        "B-177",
        "  mqtt:\n    listen:\n      tcp:\n        - name: ws\n          address: :1883\n        - name: other\n          address: :1884\n      ws:\n        address: :8083\n",
        "broker.mqtt.listen.ws",
        "      ws:",
    ),
    (
        "B-179",
        "  mqtt:\n    listen:\n      tcp:\n        address: 0.0.0.0:1883\n      ws:\n        address: 127.0.0.1:1883\n",
        "broker.mqtt.listen.ws.address",
        "address: 127.0.0.1:1883",
    ),
    (
        "B-179",
        "  mqtt:\n    listen:\n      tcp:\n        address: 127.0.0.1:9090\n  operations:\n    listen:\n      tcp:\n        address: \"[::ffff:127.0.0.1]:9090\"\n",
        "broker.operations.listen.tcp.address",
        "[::ffff",
    ),
    (
        "B-179",
        "  operations:\n    listen:\n      tcp:\n        address: 127.0.0.1:1883\n",
        "broker.operations.listen.tcp.address",
        "address: 127.0.0.1:1883",
    ),
    (
        "B-179",
        "  mqtt:\n    listen:\n      tcp:\n        address: \"[::0]:1883\"\n      ws:\n        address: 127.0.0.1:1883\n",
        "broker.mqtt.listen.ws.address",
        "address: 127.0.0.1:1883",
    ),
    (
        "B-176",
        "  mqtt:\n    listen:\n      ws:\n        - name: \"\"\n          address: :8083\n        - name: \" \"\n          address: :8084\n",
        "broker.mqtt.listen.ws[1].name",
        "name: \" \"",
    ),
    (
        "B-180",
        "  mqtt:\n    listen:\n      unix:\n        path: /run/s/x.sock\n  operations:\n    listen:\n      unix:\n        path: /run/s/./x.sock\n",
        "broker.operations.listen.unix.path",
        "path: /run/s/./",
    ),
    (
        "B-183",
        "  mqtt:\n    listen:\n      tcp:\n        address: \"[fe80::1]:1883\"\n",
        "broker.mqtt.listen.tcp.address",
        "fe80",
    ),
    (
        "B-184",
        "  mqtt:\n    listen:\n      unix:\n        path: /run/saguin/\n",
        "broker.mqtt.listen.unix.path",
        "path:",
    ),
    (
        "B-170",
        "  mqtt:\n    listen:\n      unix:\n        path: /run/s.sock\n        tls:\n          cert_file: /c.pem\n          key_file: /k.pem\n",
        "broker.mqtt.listen.unix.tls",
        "tls:",
    ),
    (
        "B-176",
        "  mqtt:\n    listen:\n      tcp:\n        - address: 127.0.0.1:1883\n        - name: b\n          address: 127.0.0.1:1884\n",
        "broker.mqtt.listen.tcp[0]",
        "- address: 127.0.0.1:1883",
    ),
    (
        "B-186",
        "  mqtt:\n    listen:\n      tcp:\n        address: :8883\n        tls:\n          key_file: /k.pem\n",
        "broker.mqtt.listen.tcp.tls.cert_file",
        "tls:",
    ),
    (
        "B-174",
        "  mqtt:\n    listen:\n      tcp:\n        address: :1883\n        acl_file: /etc/saguin/acl.yaml\n",
        "broker.mqtt.listen.tcp.acl_file",
        "acl_file",
    ),
    (
        "B-110",
        "  limits:\n    max_topic_levels: none\n",
        "broker.limits.max_topic_levels",
        "max_topic_levels",
    ),
    (
        "B-064",
        "  limits:\n    connect_timeout: 0s\n",
        "broker.limits.connect_timeout",
        "connect_timeout",
    ),
    (
        "B-514",
        "  mqtt:\n    listen:\n      ws:\n        same_origin: false\n",
        "broker.mqtt.listen.ws.address",
        "      ws:",
    ),
    (
        "B-216",
        "  mqtt:\n    listen:\n      tcp:\n        address: :1883\n        min_protocol_version: 5\n",
        "broker.mqtt.listen.tcp.min_protocol_version",
        "min_protocol_version",
    ),
    (
        "B-235",
        "  mqtt:\n    listen:\n      tcp:\n        address: :1883\n        proxy_protocol: true\n",
        "broker.mqtt.listen.tcp.proxy_protocol",
        "proxy_protocol",
    ),
    (
        "B-515",
        "  mqtt:\n    listen:\n      unix:\n        path: /run/s.sock\n        address: :1883\n",
        "broker.mqtt.listen.unix.address",
        "address",
    ),
    (
        "B-225",
        "  mqtt:\n    allow_anonymous: false\n",
        "broker.mqtt.allow_anonymous",
        "allow_anonymous",
    ),
    (
        "B-246",
        "  mqtt:\n    acl_file: /etc/saguin/acl.yaml\n",
        "broker.mqtt.acl_file",
        "acl_file",
    ),
    (
        "B-247",
        "  mqtt:\n    password_file: /etc/saguin/p\n    allow_anonymous: true\n    acl_file: /etc/saguin/acl.yaml\n",
        "broker.mqtt.allow_anonymous",
        "allow_anonymous",
    ),
    (
        "B-519",
        "  mqtt:\n    password_file: clients.passwd\n",
        "broker.mqtt.password_file",
        "password_file",
    ),
    (
        "B-032",
        "  pid_file: saguin.pid\n",
        "broker.pid_file",
        "pid_file",
    ),
    // Operations (B-358 … B-365).
    (
        "B-358",
        "  operations:\n    min_scrape_interval: 60s\n",
        "broker.operations.listen",
        "  operations:",
    ),
    (
        "B-361",
        "  operations:\n    listen:\n      tcp:\n        address: 0.0.0.0:9090\n",
        "broker.operations.listen.tcp.address",
        "0.0.0.0:9090",
    ),
    (
        "B-362",
        "  operations:\n    listen:\n      tcp:\n        address: 0.0.0.0:9090\n        tls:\n          cert_file: /c.pem\n          key_file: /k.pem\n          client_ca_file: /ca.pem\n          require_certificate: false\n",
        "broker.operations.listen.tcp.address",
        "0.0.0.0:9090",
    ),
    (
        "B-362",
        "  operations:\n    listen:\n      tcp:\n        - name: guarded\n          address: 0.0.0.0:9090\n          password_file: /etc/saguin/ops.passwd\n        - name: bare\n          address: 0.0.0.0:9091\n",
        "broker.operations.listen.tcp[1].address",
        "0.0.0.0:9091",
    ),
    (
        "B-362",
        "  operations:\n    listen:\n      tcp:\n        address: 0.0.0.0:9090\n      unix:\n        path: /run/o.sock\n        password_file: /etc/saguin/ops.passwd\n",
        "broker.operations.listen.tcp.address",
        "0.0.0.0:9090",
    ),
    (
        "B-364",
        "  operations:\n    listen:\n      unix:\n        path: /run/o.sock\n        allow_anonymous: true\n",
        "broker.operations.listen.unix.allow_anonymous",
        "allow_anonymous",
    ),
    (
        "B-364",
        "  operations:\n    listen:\n      tcp:\n        address: 127.0.0.1:9090\n        allow_anonymous: false\n",
        "broker.operations.listen.tcp.allow_anonymous",
        "allow_anonymous",
    ),
    (
        "B-364",
        "  operations:\n    allow_anonymous: true\n    listen:\n      tcp:\n        address: 127.0.0.1:9090\n",
        "broker.operations.allow_anonymous",
        "allow_anonymous",
    ),
    (
        "B-365",
        "  operations:\n    listen:\n      unix:\n        path: /run/o.sock\n    min_scrape_interval: 30s\n",
        "broker.operations.min_scrape_interval",
        "min_scrape_interval",
    ),
    (
        "B-365",
        "  operations:\n    listen:\n      unix:\n        path: /run/o.sock\n    min_scrape_interval: 500ms\n",
        "broker.operations.min_scrape_interval",
        "min_scrape_interval",
    ),
    // The small blocks (B-433 … B-453).
    (
        "B-433",
        "  retained:\n    retention_bytes: 1GiB\n",
        "broker.retained.retention_bytes",
        "retention_bytes",
    ),
    (
        "B-433",
        "  retained:\n    max_bytes: 1GiB\n",
        "broker.retained.max_bytes",
        "max_bytes",
    ),
    (
        "B-444",
        "  qos2:\n    max_bytes: 1GiB\n",
        "broker.qos2.max_bytes",
        "max_bytes",
    ),
    ("B-444", "  qos2: false\n", "broker.qos2", "qos2"),
    (
        "B-446",
        "  share:\n    expires_after: 500ms\n",
        "broker.share.expires_after",
        "expires_after",
    ),
    (
        "B-452",
        "  session:\n    ack_commit_interval: 5ms\n",
        "broker.session.ack_commit_interval",
        "ack_commit_interval",
    ),
    (
        "B-452",
        "  session:\n    ack_commit_interval: none\n",
        "broker.session.ack_commit_interval",
        "ack_commit_interval",
    ),
    (
        "B-453",
        "  session:\n    max_bytes: 1GiB\n",
        "broker.session.max_bytes",
        "max_bytes",
    ),
    (
        "B-027",
        "  log_file: /var/log/saguin.log\n",
        "broker.log_file",
        "log_file",
    ),
    // Bridges (B-205 … B-208, B-379 … B-547).
    (
        "B-395",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: $share/hub/fleet/#\n        topic: readings/$#\n        direction: in\n",
        "bridges.b.topics[0].filter",
        "filter: $share",
    ),
    (
        "B-530",
        "bridges:\n  b:\n    peer: mqtt://h:1883\n    client_id: c\n    topics: [{filter: a/#, direction: both}]\n",
        "bridges.b.peer",
        "peer:",
    ),
    (
        "B-530",
        "bridges:\n  b:\n    peer: tcp://h\n    client_id: c\n    topics: [{filter: a/#, direction: both}]\n",
        "bridges.b.peer",
        "peer:",
    ),
    (
        "B-531",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    topics: [{filter: a/#, direction: both}]\n",
        "bridges.b.client_id",
        "  b:",
    ),
    (
        "B-532",
        "bridges:\n  a:\n    peer: tcp://h:1883\n    client_id: c\n    topics: [{filter: a/#, direction: both}]\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics: [{filter: b/#, direction: both}]\n",
        "bridges.b.client_id",
        "  b:",
    ),
    (
        "B-533",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n",
        "bridges.b.topics",
        "  b:",
    ),
    (
        "B-534",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    session_expiry: none\n    topics: [{filter: a/#, direction: both}]\n",
        "bridges.b.session_expiry",
        "session_expiry",
    ),
    (
        "B-535",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    receive_maximum: 0\n    topics: [{filter: a/#, direction: both}]\n",
        "bridges.b.receive_maximum",
        "receive_maximum",
    ),
    (
        "B-535",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    receive_maximum: 70000\n    topics: [{filter: a/#, direction: both}]\n",
        "bridges.b.receive_maximum",
        "receive_maximum",
    ),
    (
        "B-536",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    ack_interval: 2s\n    topics: [{filter: a/#, direction: both}]\n",
        "bridges.b.ack_interval",
        "ack_interval",
    ),
    (
        "B-205",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    ca_file: /ca.pem\n    topics: [{filter: a/#, direction: both}]\n",
        "bridges.b.ca_file",
        "ca_file",
    ),
    (
        "B-206",
        "bridges:\n  b:\n    peer: tls://h:8883\n    client_id: c\n    cert_file: /c.pem\n    topics: [{filter: a/#, direction: both}]\n",
        "bridges.b.cert_file",
        "cert_file",
    ),
    (
        "B-208",
        "bridges:\n  b:\n    peer: ws://h:80\n    client_id: c\n    cert_file: /c.pem\n    key_file: /k.pem\n    topics: [{filter: a/#, direction: both}]\n",
        "bridges.b.cert_file",
        "cert_file",
    ),
    (
        "B-379",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: a/#\n",
        "bridges.b.topics[0].direction",
        "- filter",
    ),
    // Two out rules whose filter and topic join to the same name would share their
    // stored positions.
    (
        "B-384",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: plant/+\n        topic: x/$1\n        direction: out\n      - filter: plant/+/x\n        topic: $1\n        direction: out\n",
        "bridges.b.topics[1].filter",
        "filter: plant/+/x",
    ),
    (
        "B-389",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: a/#\n        direction: in\n",
        "bridges.b.topics[0].topic",
        "- filter",
    ),
    (
        "B-389",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: a/#\n        topic: x/$#\n        direction: both\n",
        "bridges.b.topics[0].topic",
        "topic:",
    ),
    (
        "A-223",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: far/#\n        topic: jobs/__dlq/$#\n        direction: in\n",
        "bridges.b.topics[0].topic",
        "topic:",
    ),
    (
        "A-223",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: jobs/__dlq/#\n        direction: both\n",
        "bridges.b.topics[0].filter",
        "filter:",
    ),
    (
        "B-538",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: $saguin/queue/x\n        topic: x\n        direction: in\n",
        "bridges.b.topics[0].filter",
        "filter:",
    ),
    (
        "B-539",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: $SYS/#\n        direction: both\n",
        "bridges.b.topics[0].filter",
        "filter:",
    ),
    (
        "B-543",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: fleet/a+b/#\n        topic: x/$#\n        direction: in\n",
        "bridges.b.topics[0].filter",
        "filter:",
    ),
    (
        "B-540",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: a/#/b\n        direction: both\n",
        "bridges.b.topics[0].filter",
        "filter:",
    ),
    (
        "B-541",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: a/{x,y}\n        topic: out/t\n        direction: out\n      - filter: a/y\n        topic: out/t\n        direction: out\n",
        "bridges.b.topics[1].filter",
        "filter: a/y",
    ),
    (
        "B-544",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: a/+\n        topic: x/$2\n        direction: in\n",
        "bridges.b.topics[0].topic",
        "topic:",
    ),
    (
        "B-544",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: a/+\n        topic: x/$1/$#\n        direction: in\n",
        "bridges.b.topics[0].topic",
        "topic:",
    ),
    (
        "B-544",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: a/#\n        topic: $#/x\n        direction: in\n",
        "bridges.b.topics[0].topic",
        "topic:",
    ),
    (
        "B-545",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: a/#\n        topic: x\n        direction: in\n",
        "bridges.b.topics[0].topic",
        "topic:",
    ),
    (
        "B-547",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: a/+\n        topic: x/+/$1\n        direction: in\n",
        "bridges.b.topics[0].topic",
        "topic:",
    ),
    (
        "B-547",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: a/+\n        topic: /x/$1\n        direction: in\n",
        "bridges.b.topics[0].topic",
        "topic:",
    ),
    (
        "B-547",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: a/+\n        topic: x/$y/$1\n        direction: in\n",
        "bridges.b.topics[0].topic",
        "topic:",
    ),
    (
        "B-108",
        "  limits:\n    max_topic_levels: 2\nbridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: a/b/c\n        direction: both\n",
        "bridges.b.topics[0].filter",
        "filter:",
    ),
];

/// B-148: each commit-key refusal (B-144 … B-147 rows) names its key and says why.
/// B-488 (row A-022: braces in a queue filter), B-489 (rows A-016..A-018).
#[test]
fn every_validation_rule_is_refused_naming_its_key_and_line() {
    let mut failures = Vec::new();
    for (id, suffix, key, marker) in INVALID {
        let (text, result) = load(suffix);
        let want_line = line_of(&text, marker.split('\n').next().unwrap_or(marker))
            + marker.matches('\n').count() as u32;
        match result {
            Ok(_) => failures.push(format!("{id}: accepted\n{suffix}")),
            Err(e) => {
                let hit = e
                    .findings()
                    .iter()
                    .any(|f| f.key == *key && f.line == want_line && f.file == "saguin.yaml");
                if !hit {
                    failures.push(format!("{id}: wanted {key} on line {want_line}, got:\n{e}"));
                }
                // Every finding says what to write instead, in the spec's shape.
                for f in e.findings() {
                    if !(f.text.starts_with(": ") || f.text.starts_with(' ')) || f.text.len() < 10 {
                        failures.push(format!("{id}: a finding with no remedy: {}", f.line_text()));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases:\n\n{}",
        failures.len(),
        INVALID.len(),
        failures.join("\n\n")
    );
}

/// The valid neighbour of each rule: what the finding says to write loads.
const VALID: &[(&str, &str)] = &[
    ("A-023", "channels:\n  a.b_c-D9:\n    type: append\n"),
    (
        "A-026",
        "channels:\n  aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa:\n    type: append\n",
    ),
    (
        "A-008",
        "channels:\n  water-location:\n    type: latest\n    filter: iot/water/+/location/#\n  water-measurement:\n    type: append\n    filter: iot/water/+/+/#\n  weather-measurement:\n    type: append\n    filter: iot/weather/+/{data,events}\n",
    ),
    (
        "A-019",
        "channels:\n  x:\n    type: append\n    filter: x/{a,b}/{c,d}\n",
    ),
    (
        "B-413",
        "channels:\n  x:\n    type: append\n    start: tail\n",
    ),
    (
        "B-494",
        "channels:\n  x:\n    type: latest\n    retention_period: none\n    deletion_retention_period: none\n",
    ),
    (
        "B-494",
        "channels:\n  q:\n    type: queue\n    max_bytes: 128MiB\n    dlq_retention_period: 30d\n    dlq_retention_bytes: none\n",
    ),
    (
        "B-502",
        "      mem:\n        type: memory\n        max_bytes: 64MiB\n        snapshot_dir: none\n",
    ),
    (
        "B-144",
        "        publish_commit_interval: 2ms\n        publish_commit_max_records: 32\n",
    ),
    ("B-144", "        publish_commit_interval: none\n"),
    (
        "B-152",
        "        read_connections: 0\n        flush_interval: 10ms\n",
    ),
    (
        "B-508",
        "channels:\n  q:\n    type: queue\n    visibility_timeout: 30s\n    job_expires_after: 6h\n    retry:\n      max_attempts: 1\n      backoff: linear\n      backoff_base: 2s\n",
    ),
    (
        "B-179",
        "  mqtt:\n    listen:\n      tcp:\n        address: 127.0.0.1:0\n      ws:\n        address: 127.0.0.2:0\n  operations:\n    listen:\n      tcp:\n        address: 127.0.0.1:9090\n",
    ),
    (
        "B-179",
        "  mqtt:\n    listen:\n      tcp:\n        address: 127.0.0.1:1883\n      ws:\n        address: 127.0.0.2:1883\n",
    ),
    (
        "B-225",
        "  mqtt:\n    password_file: /etc/saguin/p\n    allow_anonymous: false\n    acl_file: /etc/saguin/acl.yaml\n",
    ),
    (
        "B-246",
        "  mqtt:\n    listen:\n      tcp:\n        address: :8883\n        tls:\n          cert_file: /c.pem\n          key_file: /k.pem\n          client_ca_file: /ca.pem\n    acl_file: /etc/saguin/acl.yaml\n",
    ),
    (
        "B-361",
        "  operations:\n    password_file: /etc/saguin/ops.passwd\n    listen:\n      tcp:\n        address: 0.0.0.0:9090\n",
    ),
    (
        "B-361",
        "  operations:\n    listen:\n      tcp:\n        address: 0.0.0.0:9090\n        password_file: /etc/saguin/ops.passwd\n",
    ),
    (
        "B-361",
        "  operations:\n    listen:\n      tcp:\n        address: 0.0.0.0:9090\n        tls:\n          cert_file: /c.pem\n          key_file: /k.pem\n          client_ca_file: /ca.pem\n",
    ),
    (
        "B-365",
        "  operations:\n    listen:\n      unix:\n        path: /run/o.sock\n    min_scrape_interval: 2m\n",
    ),
    (
        "B-446",
        "  share:\n    expires_after: 1h\n  qos2:\n    max_inflight_per_client: 5\n    expires_after: 10m\n  session:\n    ack_commit_interval: 1s\n  retained:\n    retention_period: 30d\n",
    ),
    (
        "B-539",
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: $SYS/#\n        topic: peer/sys/$#\n        direction: in\n",
    ),
    (
        "B-532",
        "bridges:\n  a:\n    peer: tcp://h:1883\n    client_id: c\n    topics: [{filter: a/#, direction: both}]\n  b:\n    peer: tcp://other:1883\n    client_id: c\n    topics: [{filter: b/#, direction: both}]\n",
    ),
    (
        "B-546",
        "bridges:\n  b:\n    peer: wss://h:443/mqtt\n    client_id: c\n    topics:\n      - filter: fleet/+/t/+\n        topic: all/$2\n        direction: in\n",
    ),
];

#[test]
fn the_valid_neighbour_of_each_rule_loads() {
    let mut failures = Vec::new();
    for (id, suffix) in VALID {
        if let (_, Err(e)) = load(suffix) {
            failures.push(format!("{id}:\n{e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn b492_b496_storage_is_required_whole() {
    let err =
        config::from_str("# a comment\nbroker:\n  id: a\n", Path::new("saguin.yaml")).unwrap_err();
    let keys: Vec<&str> = err.findings().iter().map(|f| f.key.as_str()).collect();
    assert!(
        err.findings().iter().all(|f| f.line == 2),
        "reported at broker: - {err}"
    );
    for k in [
        "broker.storage.providers",
        "broker.storage.default",
        "broker.storage.default_retention_period",
        "broker.storage.default_retention_bytes",
    ] {
        assert!(keys.contains(&k), "{k}: {err}");
    }
    let (_, r) = load("");
    assert!(r.is_ok());
    let text = BASE.replace("default: local", "default: elsewhere");
    let err = config::from_str(&text, Path::new("saguin.yaml")).unwrap_err();
    assert!(
        err.findings()
            .iter()
            .any(|f| f.key == "broker.storage.default" && f.line == 4),
        "{err}"
    );
}

#[test]
fn b492_a_refused_provider_is_reported_once_where_it_is_defined() {
    // A memory provider without snapshot_dir is refused; neither the providers
    // block, the default naming it nor a channel naming it is reported beside it.
    let text = "broker:
  id: edge-1
  storage:
    default: volatile
    default_retention_period: 3d
    default_retention_bytes: none
    providers:
      volatile:
        type: memory
        max_bytes: 16MiB
channels:
  state:
    type: latest
    filter: a/#
    storage: volatile
  other:
    type: append
    filter: b/#
    storage: elsewhere
";
    let err = config::from_str(text, Path::new("saguin.yaml")).unwrap_err();
    let found: Vec<(&str, u32)> = err
        .findings()
        .iter()
        .map(|f| (f.key.as_str(), f.line))
        .collect();
    assert_eq!(
        found,
        [
            ("broker.storage.providers.volatile.snapshot_dir", 8),
            ("channels.other.storage", 19),
        ],
        "{err}"
    );
    let other = &err.findings()[1];
    assert!(other.text.contains("write one of volatile"), "{err}");
}

#[test]
fn b498_names_both_figures_and_which_limit_to_lower() {
    let (_, r) = load(
        "      mem:\n        type: memory\n        max_bytes: 1MiB\n        snapshot_dir: none\n",
    );
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("limits.max_message_size (1MiB)")
            && e.contains("limits.max_header_bytes (8KiB)"),
        "{e}"
    );
    assert!(e.contains("lower limits.max_message_size"), "{e}");
}

/// B-537: a bridge's session_expiry, receive_maximum and ack_interval are refused
/// with what the value costs, not only the range.
#[test]
fn b537_bridge_refusals_say_what_the_value_costs() {
    let bridge = |key: &str| {
        format!(
            "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    {key}\n    topics: [{{filter: a/#, direction: both}}]\n"
        )
    };
    for (setting, key, cost) in [
        (
            "session_expiry: none",
            "bridges.b.session_expiry",
            "operator can clear it",
        ),
        (
            "session_expiry: 50000d",
            "bridges.b.session_expiry",
            "the peer's storage",
        ),
        (
            "session_expiry: 4294967295s",
            "bridges.b.session_expiry",
            "the peer's storage",
        ),
        (
            "receive_maximum: 0",
            "bridges.b.receive_maximum",
            "held unacknowledged",
        ),
        (
            "ack_interval: 2s",
            "bridges.b.ack_interval",
            "receive_maximum / ack_interval",
        ),
        (
            "ack_interval: 0ms",
            "bridges.b.ack_interval",
            "receive_maximum / ack_interval",
        ),
    ] {
        let (_, r) = load(&bridge(setting));
        let e = r.expect_err(setting);
        let f = e
            .findings()
            .iter()
            .find(|f| f.key == key)
            .unwrap_or_else(|| panic!("{setting}: no finding on {key}: {e}"));
        assert!(f.text.contains(cost), "{setting}: {:?}", f.text);
    }
}

/// B-537: a receive_maximum above MQTT's range is refused with what is held
/// unacknowledged, as zero is.
#[test]
fn b537_a_receive_maximum_above_the_range_says_what_is_held() {
    let (_, r) = load(
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    receive_maximum: 70000\n    topics: [{filter: a/#, direction: both}]\n",
    );
    let e = r.unwrap_err();
    let f = e
        .findings()
        .iter()
        .find(|f| f.key == "bridges.b.receive_maximum")
        .expect("a finding");
    assert!(f.text.contains("held unacknowledged"), "{:?}", f.text);
}

/// C-029, C-064: neither retention sweep's interval nor a queue worker's concurrency
/// has a key: each spelling is refused as a key that does not exist.
#[test]
fn no_key_sets_a_sweep_interval_or_worker_concurrency_c029_c064() {
    let storage_key = |key: &str| {
        BASE.replace(
            "    providers:\n",
            &format!("    {key}: 1s\n    providers:\n"),
        )
    };
    for key in [
        "sweep_interval",
        "age_sweep_interval",
        "size_sweep_interval",
    ] {
        let text = storage_key(key);
        let r = config::from_str(&text, Path::new("saguin.yaml"));
        let e = r.expect_err(key);
        assert!(
            e.findings()
                .iter()
                .any(|f| f.key == format!("broker.storage.{key}")),
            "{key}: {e}"
        );
    }
    for key in [
        "sweep_interval",
        "concurrency",
        "worker_concurrency",
        "max_inflight",
    ] {
        let (_, r) = load(&format!(
            "channels:\n  jobs:\n    type: queue\n    filter: jobs/#\n    {key}: 2\n"
        ));
        let e = r.expect_err(key);
        assert!(
            e.findings()
                .iter()
                .any(|f| f.key == format!("channels.jobs.{key}")),
            "{key}: {e}"
        );
    }
}

/// two channels with one filter are refused at load, naming both.
#[test]
fn b486_names_both_channels_and_the_colliding_expansion() {
    let (_, r) = load(
        "channels:\n  a:\n    type: append\n    filter: x/{a,b}\n  b:\n    type: latest\n    filter: x/b\n",
    );
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("channels.b.filter \"x/b\": claims x/b, as channel a"),
        "{e}"
    );
    assert!(e.contains("\"x/{a,b}\""), "{e}");
}

#[test]
fn b546_an_unused_substitution_is_a_note_not_a_finding() {
    let (_, r) = load(VALID.iter().find(|(id, _)| *id == "B-546").unwrap().1);
    let c = r.unwrap();
    assert_eq!(c.notes.len(), 1, "{:?}", c.notes);
    assert!(c.notes[0].contains("$1"), "{:?}", c.notes);
    assert!(config::summary(&c).contains("note:"));
}

/// no `filter:` means `<name>/#`; A-029: the dead-letter name comes from the name.
/// every queue derives an append `<name>__dlq` (configuring one: the A-027 row).
#[test]
fn a009_b011_derived_names_and_filters() {
    let (_, r) = load("channels:\n  events:\n    type: append\n  jobs:\n    type: queue\n");
    let c = r.unwrap();
    assert_eq!(c.channel("events").unwrap().filters, ["events/#"]);
    assert_eq!(c.channel("jobs__dlq").unwrap().filters, ["jobs/__dlq/#"]);
    assert_eq!(
        c.channel("jobs__dlq").unwrap().dlq_of.as_deref(),
        Some("jobs")
    );
}

/// a dead-letter channel is on its queue's provider, not the default one.
#[test]
fn a215_a_dead_letter_channel_takes_its_queues_provider() {
    let (_, r) = load(
        "      mem:\n        type: memory\n        max_bytes: 64MiB\n        snapshot_dir: none\nchannels:\n  jobs:\n    type: queue\n    storage: mem\n",
    );
    let c = r.unwrap();
    assert_eq!(c.channel("jobs").unwrap().storage, "mem");
    assert_eq!(c.channel("jobs__dlq").unwrap().storage, "mem");
}

#[test]
fn b480_findings_across_every_block_arrive_together() {
    let (_, r) = load(
        "  log_level: loud\n  limits:\n    max_topic_levels: 0\nchannels:\n  a/b:\n    type: stream\nbridges:\n  b:\n    peer: mqtt://x:1\n",
    );
    let e = r.unwrap_err();
    let keys: Vec<&str> = e.findings().iter().map(|f| f.key.as_str()).collect();
    for k in [
        "broker.log_level",
        "broker.limits.max_topic_levels",
        "channels.a/b",
        "channels.a/b.type",
        "bridges.b.peer",
        "bridges.b.client_id",
    ] {
        assert!(keys.contains(&k), "{k}: {e}");
    }
}

/// `cargo test --test config_validation -- --ignored --nocapture` prints every
/// finding of the table, for reading the messages as an operator would.
#[test]
#[ignore]
fn print_every_finding() {
    for (id, suffix, _, _) in INVALID {
        if let (_, Err(e)) = load(suffix) {
            for f in e.findings() {
                println!("{id}\t{}", f.line_text());
            }
        }
    }
}

#[test]
fn b248_a_door_nothing_identifies_beside_an_acl_file_is_a_note() {
    let (_, r) = load(
        "  mqtt:\n    listen:\n      tcp:\n        address: :8883\n        tls:\n          cert_file: /c.pem\n          key_file: /k.pem\n          client_ca_file: /ca.pem\n      ws:\n        address: :8083\n    acl_file: /etc/saguin/acl.yaml\n",
    );
    let c = r.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        c.notes
            .iter()
            .any(|n| n.starts_with("broker.mqtt.listen.ws ")),
        "{:?}",
        c.notes
    );
    assert!(
        !c.notes
            .iter()
            .any(|n| n.starts_with("broker.mqtt.listen.tcp ")),
        "{:?}",
        c.notes
    );
}

#[test]
fn b504_an_inert_provider_is_a_note_not_an_error() {
    let (_, r) = load(
        "      spare:\n        type: memory\n        max_bytes: 64MiB\n        snapshot_dir: none\n",
    );
    let c = r.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        c.notes
            .iter()
            .any(|n| n.contains("provider spare") && n.contains("inert")),
        "{:?}",
        c.notes
    );
    assert_eq!(c.broker.storage.memory_total(), 64 << 20, "B-138");
}

#[test]
fn b546_the_note_says_when_the_collapse_lands_in_a_latest_channel() {
    let (_, r) = load(
        "channels:\n  fleet-state:\n    type: latest\n    filter: state/+\nbridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: fleet/+/state/+\n        topic: state/$2\n        direction: in\n",
    );
    let c = r.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        c.notes
            .iter()
            .any(|n| n.contains("$1") && n.contains("latest channel fleet-state")),
        "{:?}",
        c.notes
    );
}

/// A-223 refuses what would write into a dead-letter channel; an out rule reading
/// dead letters to ship them elsewhere writes nothing here.
#[test]
fn a223_an_out_rule_may_read_dead_letters() {
    let (_, r) = load(
        "bridges:\n  b:\n    peer: tcp://h:1883\n    client_id: c\n    topics:\n      - filter: jobs/__dlq/#\n        topic: site/dead/$#\n        direction: out\n",
    );
    let c = r.expect("an out rule on dead letters is accepted");
    assert_eq!(c.bridges[0].topics[0].filter, "jobs/__dlq/#");
}

/// Every validation case's file, and the example, mutated a few edits at a time:
/// each load refuses with findings that name a line of the file and say what to
/// do, or accepts - and never panics (the brief: a wrong config gets a clear
/// message naming the key and file:line, never a panic). Deterministic and bounded.
#[test]
fn mutated_files_are_refused_with_findings_or_accepted_never_a_panic() {
    let mut seeds: Vec<String> = INVALID
        .iter()
        .map(|(_, suffix, _, _)| format!("{BASE}{suffix}"))
        .chain(VALID.iter().map(|(_, suffix)| format!("{BASE}{suffix}")))
        .collect();
    seeds.push(include_str!("../examples/saguin.yaml").to_owned());
    let (accepted, refused) = mutate::check(
        &seeds,
        mutate::cases_and_rng(6000, 0x5A61_7569_6E21_0001),
        |text| config::from_str(text, Path::new("m.yaml")),
    );
    // The mutations reach both answers, or the test checks little.
    assert!(
        accepted > 50 && refused > 1000,
        "{accepted} accepted, {refused} refused"
    );
}
