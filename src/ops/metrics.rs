//! What `/health` and `/metrics` say, read off the broker's state. Names follow the
//! spec wherever it names a metric (gaps §4 for the labels it leaves open).

use std::fmt::Write;
use std::sync::Arc;

use crate::routing::filter;
use crate::server::Shared;
use crate::storage::ChannelStats;

/// Whether the broker is serving (listeners up, every provider writable), and the JSON
/// body that says so or names what is wrong.
pub fn health(shared: &Shared) -> (bool, String) {
    let stopping = shared.stopping();
    let providers = shared.broker.borrow().channels.providers();
    let problems: Vec<String> = providers.iter().filter_map(|p| p.health().err()).collect();
    let status = match (stopping, problems.is_empty()) {
        (true, _) => "stopping",
        (false, true) => "ok",
        (false, false) => "unavailable",
    };
    let mut body = serde_json::json!({
        "status": status,
        "broker_id": shared.settings.broker_id,
        "connections": shared.active_connections(),
    });
    if !problems.is_empty() {
        body["problems"] = serde_json::json!(problems);
    }
    (status == "ok", format!("{body}\n"))
}

/// One channel as a scrape reports it.
pub struct ChannelRow {
    name: Arc<str>,
    kind: &'static str,
    /// As the configuration wrote it, braces and all.
    filter: Arc<str>,
    /// `None` where its provider did not answer.
    stats: Option<ChannelStats>,
}

/// Each channel's name, type, filter and stats.
pub async fn channel_stats(shared: &Shared) -> Vec<ChannelRow> {
    let channels: Vec<_> = {
        let broker = shared.broker.borrow();
        broker
            .channels
            .iter()
            .map(|(_, c)| {
                let row = ChannelRow {
                    name: c.name.clone(),
                    kind: c.kind.as_str(),
                    filter: c.filter.clone(),
                    stats: None,
                };
                (row, c.provider.clone())
            })
            .collect()
    };
    let mut out = Vec::with_capacity(channels.len());
    for (mut row, provider) in channels {
        row.stats = provider.stats(&row.name).await.ok();
        out.push(row);
    }
    out
}

/// One metric family in the text exposition format.
struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn emit(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        samples: impl IntoIterator<Item = (String, u64)>,
    ) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(self.out, "{name}{labels} {value}");
        }
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: u64) {
        self.emit(name, kind, help, [(String::new(), value)]);
    }
}

/// A label value, escaped as the exposition format requires.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text exposition of every counter and gauge.
pub fn render(shared: &Shared, channels: &[ChannelRow]) -> String {
    let broker = shared.broker.borrow();
    let m = &broker.metrics;
    let mut out = String::with_capacity(4096);
    let mut f = Family { out: &mut out };
    let build = format!(
        "{{version=\"{}\",broker_id=\"{}\"}}",
        env!("CARGO_PKG_VERSION"),
        escape(&shared.settings.broker_id)
    );
    f.emit(
        "saguin_build_info",
        "gauge",
        "Version and broker id.",
        [(build, 1)],
    );
    f.one(
        "saguin_connections",
        "gauge",
        "Connections open now.",
        shared.active_connections() as u64,
    );
    f.one(
        "saguin_connection_slots_taken",
        "gauge",
        "Slots of limits.max_connections held, by connections admitted or reading CONNECT.",
        shared.slots_taken() as u64,
    );
    f.one(
        "saguin_connections_total",
        "counter",
        "Connections accepted since start.",
        m.connections_total.get(),
    );
    let refused = m.connections_refused.borrow();
    f.emit(
        "saguin_connections_refused_total",
        "counter",
        "Connections refused, by reason.",
        refused
            .iter()
            .map(|(r, n)| (format!("{{reason=\"{r}\"}}"), *n)),
    );
    let (subscriptions, queued_messages, queued_bytes) = broker.session_totals();
    f.one(
        "saguin_sessions",
        "gauge",
        "Clients' sessions held.",
        broker.session_count() as u64,
    );
    f.one(
        "saguin_subscriptions",
        "gauge",
        "Topic filters held across clients' sessions.",
        subscriptions as u64,
    );
    f.one(
        "saguin_session_queue_messages",
        "gauge",
        "Deliveries sessions are owed.",
        queued_messages as u64,
    );
    f.one(
        "saguin_session_queue_bytes",
        "gauge",
        "Bytes sessions are charged.",
        queued_bytes as u64,
    );
    let refused = m.subscriptions_refused.borrow();
    f.emit(
        "saguin_subscriptions_refused_total",
        "counter",
        "Filters a SUBACK refused, by the code decided for them.",
        refused
            .iter()
            .map(|(code, n)| (format!("{{code=\"0x{code:02X}\"}}"), *n)),
    );
    let gaps = m.consumer_gaps.borrow();
    f.emit(
        "saguin_consumer_gap_records_total",
        "counter",
        "Offsets of an append channel retention took before a consumer's position reached them (gaps G-11).",
        gaps.iter()
            .map(|(channel, n)| (format!("{{channel=\"{}\"}}", escape(channel)), *n)),
    );
    f.one(
        "saguin_messages_received_total",
        "counter",
        "Broadcast publishes routed.",
        m.messages_received.get(),
    );
    let refused = m.publish_refused.borrow();
    f.emit(
        "saguin_publish_refused_total",
        "counter",
        "Publishes refused, by reason.",
        refused
            .iter()
            .map(|(label, n)| (format!("{{reason=\"{label}\"}}"), *n)),
    );
    f.emit(
        "saguin_session_deliveries_dropped_total",
        "counter",
        "Deliveries a session gave up, by cause.",
        [
            (
                "{cause=\"session_queue_full\"}".to_string(),
                m.dropped_queue_full.get(),
            ),
            (
                "{cause=\"no_shared_member\"}".to_string(),
                m.dropped_no_shared_member.get(),
            ),
            (
                "{cause=\"storage_full\"}".to_string(),
                m.dropped_storage_full.get(),
            ),
        ],
    );
    f.emit(
        "saguin_sessions_dropped_total",
        "counter",
        "Sessions that asked to outlive their connection and end with it, by cause.",
        [(
            "{cause=\"storage_full\"}".to_string(),
            m.sessions_dropped_full.get(),
        )],
    );
    f.emit(
        "saguin_shares_dropped_total",
        "counter",
        "Shared-group deliveries given up, by cause.",
        [
            (
                "{cause=\"expired\"}".to_string(),
                m.dropped_share_expired.get(),
            ),
            (
                "{cause=\"storage_full\"}".to_string(),
                m.dropped_share_storage_full.get(),
            ),
        ],
    );
    f.one(
        "saguin_deliveries_dropped_total",
        "counter",
        "Broadcast deliveries a full session gave up, oldest first.",
        m.dropped_queue_full.get(),
    );
    f.one(
        "saguin_deliveries_refused_total",
        "counter",
        "QoS 2 deliveries refused to a session at its bound with nothing to give up.",
        m.deliveries_refused.get(),
    );
    f.one(
        "saguin_qos2_held",
        "gauge",
        "Inbound QoS 2 publishes held until their PUBREL.",
        broker.qos2_held() as u64,
    );
    f.one(
        "saguin_qos2_abandoned_total",
        "counter",
        "Held QoS 2 publishes given up after broker.qos2.expires_after.",
        m.qos2_abandoned.get(),
    );
    f.one(
        "saguin_qos2_max_inflight_per_client",
        "gauge",
        "broker.qos2.max_inflight_per_client.",
        shared.settings.qos2_max_inflight as u64,
    );
    f.one(
        "saguin_wills_waiting",
        "gauge",
        "Wills waiting out their delay.",
        broker.wills_waiting() as u64,
    );
    f.one(
        "saguin_wills_published_total",
        "counter",
        "Wills published.",
        m.wills_published.get(),
    );
    f.one(
        "saguin_storage_errors_total",
        "counter",
        "Storage operations that failed.",
        m.storage_errors.get(),
    );
    f.emit(
        "saguin_channel_info",
        "gauge",
        "Every channel, its type, and each filter it claims (C-018: braces expanded).",
        channels.iter().flat_map(|row| {
            let mut filters =
                filter::expand_braces(&row.filter).unwrap_or_else(|_| vec![row.filter.to_string()]);
            // `a/{x,x}` claims a/x once: one series each, never two alike.
            filters.sort();
            filters.dedup();
            filters.into_iter().map(move |f| {
                let labels = format!(
                    "{{channel=\"{}\",type=\"{}\",filter=\"{}\"}}",
                    escape(&row.name),
                    row.kind,
                    escape(&f)
                );
                (labels, 1)
            })
        }),
    );
    let stat = |pick: fn(&ChannelStats) -> u64| {
        channels.iter().filter_map(move |row| {
            row.stats
                .as_ref()
                .map(|s| (format!("{{channel=\"{}\"}}", escape(&row.name)), pick(s)))
        })
    };
    f.emit(
        "saguin_channel_records",
        "gauge",
        "Records a channel holds.",
        stat(|s| s.records),
    );
    f.emit(
        "saguin_channel_bytes",
        "gauge",
        "Bytes a channel holds, counted as the spec counts a record.",
        stat(|s| s.bytes),
    );
    f.emit(
        "saguin_channel_floor_offset",
        "gauge",
        "The lowest offset a channel holds.",
        stat(|s| s.floor),
    );
    f.emit(
        "saguin_channel_head_offset",
        "gauge",
        "The offset the next record gets.",
        stat(|s| s.head),
    );
    let providers = broker.channels.providers();
    f.emit(
        "saguin_provider_bytes_used",
        "gauge",
        "Bytes a storage provider uses.",
        providers.iter().map(|p| {
            (
                format!("{{provider=\"{}\"}}", escape(p.name())),
                p.used_bytes(),
            )
        }),
    );
    f.emit(
        "saguin_provider_bytes_max",
        "gauge",
        "A storage provider's max_bytes, its reserve included.",
        providers.iter().map(|p| {
            (
                format!("{{provider=\"{}\"}}", escape(p.name())),
                p.max_bytes(),
            )
        }),
    );
    queue_metrics(&m.queues.borrow(), &mut f);
    bridge_metrics(&m.bridges.borrow(), &mut f);
    f.one(
        "saguin_process_resident_memory_bytes",
        "gauge",
        "Resident set size.",
        resident_bytes(),
    );
    out
}

/// `saguin_bridge_connected{bridge}`, `saguin_bridge_unstored_total{bridge,cause}`
/// (gaps section 4) and `saguin_bridge_gap_records_total{bridge,filter}` (B-384);
/// nothing when no bridge is configured.
fn bridge_metrics(
    bridges: &std::collections::BTreeMap<String, crate::broker::metrics::BridgeCounts>,
    f: &mut Family<'_>,
) {
    if bridges.is_empty() {
        return;
    }
    f.emit(
        "saguin_bridge_connected",
        "gauge",
        "1 while the bridge's link to its peer is up.",
        bridges.iter().map(|(name, b)| {
            (
                format!("{{bridge=\"{}\"}}", escape(name)),
                u64::from(b.connected),
            )
        }),
    );
    f.emit(
        "saguin_bridge_unstored_total",
        "counter",
        "Records a bridge let go at this hop, by cause.",
        bridges.iter().flat_map(|(name, b)| {
            b.unstored.iter().map(move |(cause, n)| {
                (
                    format!("{{bridge=\"{}\",cause=\"{cause}\"}}", escape(name)),
                    *n,
                )
            })
        }),
    );
    f.emit(
        "saguin_bridge_gap_records_total",
        "counter",
        "Offsets retention took before an out rule's position reached them, by rule.",
        bridges.iter().flat_map(|(name, b)| {
            b.gaps.iter().map(move |(filter, n)| {
                (
                    format!(
                        "{{bridge=\"{}\",filter=\"{}\"}}",
                        escape(name),
                        escape(filter)
                    ),
                    *n,
                )
            })
        }),
    );
}

/// The `saguin_queue_*` families (gaps section 4): counters per queue, dead letters by
/// reason, and the depth gauge by state.
fn queue_metrics(
    queues: &std::collections::BTreeMap<String, crate::broker::metrics::QueueCounts>,
    f: &mut Family<'_>,
) {
    use crate::broker::metrics::QueueCounts;
    let per = |pick: fn(&QueueCounts) -> u64| {
        queues
            .iter()
            .map(move |(name, c)| (format!("{{channel=\"{}\"}}", escape(name)), pick(c)))
    };
    f.emit(
        "saguin_queue_delivered_total",
        "counter",
        "Jobs offered to a worker.",
        per(|c| c.delivered),
    );
    f.emit(
        "saguin_queue_acknowledged_total",
        "counter",
        "Jobs resolved by ack.",
        per(|c| c.acknowledged),
    );
    f.emit(
        "saguin_queue_returned_total",
        "counter",
        "Jobs handed back by return.",
        per(|c| c.returned),
    );
    f.emit(
        "saguin_queue_timed_out_total",
        "counter",
        "Leases whose visibility timeout passed.",
        per(|c| c.timed_out),
    );
    f.emit(
        "saguin_queue_dead_lettered_total",
        "counter",
        "Jobs moved to the dead-letter channel, by reason.",
        queues.iter().flat_map(|(name, c)| {
            [
                ("attempts_exhausted", c.dead_lettered_attempts),
                ("expired", c.dead_lettered_expired),
            ]
            .map(|(reason, n)| {
                (
                    format!("{{channel=\"{}\",reason=\"{reason}\"}}", escape(name)),
                    n,
                )
            })
        }),
    );
    f.emit(
        "saguin_queue_retain_ignored_total",
        "counter",
        "Retained publishes into a queue taken as work with the flag dropped.",
        per(|c| c.retain_ignored),
    );
    f.emit(
        "saguin_queue_depth",
        "gauge",
        "Jobs in a queue: waiting (available), or out with a worker (held).",
        queues.iter().flat_map(|(name, c)| {
            [("available", c.available), ("held", c.held)].map(|(state, n)| {
                (
                    format!("{{channel=\"{}\",state=\"{state}\"}}", escape(name)),
                    n,
                )
            })
        }),
    );
}

/// The process's resident set size, from /proc (0 where there is none): `VmRSS`,
/// in kB whatever the page size (aarch64 kernels run 4, 16 or 64 KiB pages).
fn resident_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    vm_rss_bytes(&status).unwrap_or(0)
}

fn vm_rss_bytes(status: &str) -> Option<u64> {
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kib: u64 = kib.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_vm_rss_whatever_the_page_size() {
        let status = "Name:\tsaguin\nVmHWM:\t   9000 kB\nVmRSS:\t   8124 kB\nThreads:\t3\n";
        assert_eq!(vm_rss_bytes(status), Some(8124 * 1024));
        assert_eq!(vm_rss_bytes("Name:\tx\n"), None);
        assert!(resident_bytes() > 0, "this process has a VmRSS");
    }
}
