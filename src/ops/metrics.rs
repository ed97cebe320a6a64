//! What `/health` and `/metrics` say, read off the broker's state.

use std::fmt::Write;

use crate::server::Shared;

/// Whether the broker is serving, and the JSON body that says so.
pub fn health(shared: &Shared) -> (bool, String) {
    let stopping = shared.stopping();
    let body = serde_json::json!({
        "status": if stopping { "stopping" } else { "ok" },
        "broker_id": shared.settings.broker_id,
        "connections": shared.active_connections(),
    });
    (!stopping, format!("{body}\n"))
}

/// The Prometheus text exposition of every counter and gauge.
pub fn render(shared: &Shared) -> String {
    let broker = shared.broker.borrow();
    let m = &broker.metrics;
    let mut out = String::with_capacity(2048);
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let one = |v: u64| vec![(String::new(), v)];
    metric(
        "saguin_build_info",
        "gauge",
        "Version and broker id.",
        &[(
            format!(
                "{{version=\"{}\",broker_id=\"{}\"}}",
                env!("CARGO_PKG_VERSION"),
                shared.settings.broker_id
            ),
            1,
        )],
    );
    metric(
        "saguin_connections",
        "gauge",
        "Connections open now.",
        &one(shared.active_connections() as u64),
    );
    metric(
        "saguin_connections_total",
        "counter",
        "Connections accepted since start.",
        &one(m.connections_total.get()),
    );
    metric(
        "saguin_sessions",
        "gauge",
        "Sessions held.",
        &one(broker.session_count() as u64),
    );
    metric(
        "saguin_messages_received_total",
        "counter",
        "Publishes routed.",
        &one(m.messages_received.get()),
    );
    metric(
        "saguin_wills_published_total",
        "counter",
        "Wills published.",
        &one(m.wills_published.get()),
    );
    let refused: Vec<(String, u64)> = m
        .publish_refused
        .borrow()
        .iter()
        .map(|(label, n)| (format!("{{reason=\"{label}\"}}"), *n))
        .collect();
    metric(
        "saguin_publish_refused_total",
        "counter",
        "Publishes refused, by reason.",
        &refused,
    );
    metric(
        "saguin_session_deliveries_dropped_total",
        "counter",
        "Deliveries a session gave up, by cause.",
        &[
            (
                "{cause=\"session_queue_full\"}".into(),
                m.dropped_queue_full.get(),
            ),
            (
                "{cause=\"no_shared_member\"}".into(),
                m.dropped_no_shared_member.get(),
            ),
        ],
    );
    queue_metrics(&m.queues.borrow(), &mut metric);
    metric(
        "saguin_process_resident_memory_bytes",
        "gauge",
        "Resident set size.",
        &one(resident_bytes()),
    );
    out
}

/// The `saguin_queue_*` families (gaps section 4): counters per queue, dead letters by
/// reason, and the depth gauge by state.
fn queue_metrics(
    queues: &std::collections::BTreeMap<String, crate::broker::metrics::QueueCounts>,
    metric: &mut impl FnMut(&str, &str, &str, &[(String, u64)]),
) {
    let per = |f: fn(&crate::broker::metrics::QueueCounts) -> u64| -> Vec<(String, u64)> {
        queues
            .iter()
            .map(|(name, c)| (format!("{{channel=\"{name}\"}}"), f(c)))
            .collect()
    };
    metric(
        "saguin_queue_delivered_total",
        "counter",
        "Jobs offered to a worker.",
        &per(|c| c.delivered),
    );
    metric(
        "saguin_queue_acknowledged_total",
        "counter",
        "Jobs resolved by ack.",
        &per(|c| c.acknowledged),
    );
    metric(
        "saguin_queue_returned_total",
        "counter",
        "Jobs handed back by return.",
        &per(|c| c.returned),
    );
    metric(
        "saguin_queue_timed_out_total",
        "counter",
        "Leases whose visibility timeout passed.",
        &per(|c| c.timed_out),
    );
    let mut dead = Vec::new();
    for (name, c) in queues {
        for (reason, n) in [
            ("attempts_exhausted", c.dead_lettered_attempts),
            ("expired", c.dead_lettered_expired),
        ] {
            dead.push((format!("{{channel=\"{name}\",reason=\"{reason}\"}}"), n));
        }
    }
    metric(
        "saguin_queue_dead_lettered_total",
        "counter",
        "Jobs moved to the dead-letter channel, by reason.",
        &dead,
    );
    metric(
        "saguin_queue_retain_ignored_total",
        "counter",
        "Retained publishes into a queue taken as work with the flag dropped.",
        &per(|c| c.retain_ignored),
    );
    let mut depth = Vec::new();
    for (name, c) in queues {
        depth.push((
            format!("{{channel=\"{name}\",state=\"available\"}}"),
            c.available,
        ));
        depth.push((format!("{{channel=\"{name}\",state=\"held\"}}"), c.held));
    }
    metric(
        "saguin_queue_depth",
        "gauge",
        "Jobs in a queue: waiting (available), or out with a worker (held).",
        &depth,
    );
}

/// The process's resident set size, from /proc (0 where there is none).
fn resident_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}
