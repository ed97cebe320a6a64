//! From a validated configuration to what the broker runs with: providers opened,
//! channels registered with them, settings mapped, doors bound. Everything that can
//! fail here fails before a listener opens, with a message naming what to fix.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use crate::auth::Gate;
use crate::broker::channels::{Channel, Channels, Kind, MaxAge};
use crate::config::{self, ChannelType, Config};
use crate::ops::OpsDoors;
use crate::routing::Router;
use crate::server::Door;
use crate::storage::{
    self, ChannelKind, ChannelSettings, Provider, ProviderSettings, Retention, RetentionSchedule,
};

/// The storage settings a configured provider maps to. The reserve each provider keeps
/// is `max_message_size + max_header_bytes` (RFC 0002 "Bounds on what a channel holds").
pub fn provider_settings(config: &Config, provider: &config::Provider) -> ProviderSettings {
    let limits = &config.broker.limits;
    let reserve = u64::from(limits.max_message_size) + u64::from(limits.max_header_bytes);
    match &provider.kind {
        config::ProviderKind::Sqlite(s) => ProviderSettings::Sqlite(storage::SqliteSettings {
            name: provider.name.clone(),
            file_path: s.file_path.clone(),
            max_bytes: s.max_bytes.unwrap_or(u64::MAX),
            reserve_bytes: reserve,
            commit: match s.commit {
                config::CommitMode::Collect => storage::CommitMode::Collect,
                config::CommitMode::PerPublish => storage::CommitMode::PerPublish,
                config::CommitMode::Batch {
                    interval,
                    max_records,
                } => storage::CommitMode::Interval {
                    interval,
                    max_records: max_records as usize,
                },
            },
            read_connections: usize::from(s.read_connections),
            flush_interval: s.flush_interval,
        }),
        config::ProviderKind::Memory(m) => ProviderSettings::Memory(storage::MemorySettings {
            name: provider.name.clone(),
            max_bytes: m.max_bytes.unwrap_or(u64::MAX),
            reserve_bytes: reserve,
            snapshot_dir: m.snapshot_dir.clone(),
        }),
    }
}

/// What a configured channel is, to its provider.
fn channel_settings(channel: &config::Channel) -> ChannelSettings {
    let kind = match (&channel.kind, &channel.dlq_of) {
        (_, Some(queue)) => ChannelKind::DeadLetter {
            queue: queue.clone(),
        },
        (ChannelType::Append, None) => ChannelKind::Append,
        (ChannelType::Latest, None) => ChannelKind::Latest {
            deletion_retention: channel.deletion_retention_period,
        },
        (ChannelType::Queue, None) => ChannelKind::Queue {
            job_expires_after: channel.queue.as_ref().and_then(|q| q.job_expires_after),
        },
    };
    ChannelSettings {
        kind,
        max_bytes: channel.max_bytes,
        retention: Retention {
            period: channel.retention_period,
            bytes: channel.retention_bytes,
        },
    }
}

/// Opens every provider a channel lives on and registers each channel with it.
///
/// # Errors
/// A provider that cannot be opened (its lock held, its file unreadable) or a channel
/// it refuses, named.
pub async fn open_channels(config: &Config) -> Result<(Channels, RetentionSchedule), String> {
    let mut providers: HashMap<&str, Arc<Provider>> = HashMap::new();
    let opened = open_all(config, &mut providers).await;
    if opened.is_err() {
        close_providers(providers.values());
    }
    opened
}

/// Closes `providers` on a start that fails once they are open: a memory provider
/// writes its snapshot, so retained values moved into its channels are not
/// lost with the process, and a sqlite provider forces its log to disk.
pub fn close_providers<'a>(providers: impl IntoIterator<Item = &'a Arc<Provider>>) {
    for provider in providers {
        if let Err(e) = provider.close(crate::broker::records::now_ms()) {
            log::error!("storage provider {}: {e}", provider.name());
        }
    }
}

async fn open_all<'a>(
    config: &'a Config,
    providers: &mut HashMap<&'a str, Arc<Provider>>,
) -> Result<(Channels, RetentionSchedule), String> {
    let mut list = Vec::new();
    let mut all_settings = Vec::new();
    for channel in &config.channels {
        let provider = provider_named(config, providers, &channel.storage)
            .map_err(|e| format!("channel {}: {e}", channel.name))?;
        let settings = channel_settings(channel);
        let max_bytes = settings.max_bytes.filter(|_| !settings.is_latest());
        all_settings.push(settings.clone());
        provider
            .open_channel(&channel.name, settings)
            .await
            .map_err(|e| format!("channel {}: {e}", channel.name))?;
        let kind = match (&channel.kind, &channel.dlq_of) {
            (_, Some(_)) => Kind::DeadLetter,
            (ChannelType::Append, None) => Kind::Append {
                tail: channel.start == config::Start::Tail,
            },
            (ChannelType::Latest, None) => Kind::Latest,
            (ChannelType::Queue, None) => Kind::Queue,
        };
        list.push(Channel {
            name: Arc::from(channel.name.as_str()),
            kind,
            filter: Arc::from(channel.filter.as_str()),
            provider,
            readers: Default::default(),
            queue: queue_policy(channel),
            max_age: {
                let ms = |d: Option<std::time::Duration>| {
                    d.filter(|_| kind == Kind::Latest)
                        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                };
                MaxAge {
                    values: ms(channel.retention_period),
                    deletions: ms(channel.deletion_retention_period),
                }
            },
            max_bytes,
        });
    }
    let memory_total = config.broker.storage.memory_total();
    if memory_total > 0 {
        log::info!(
            "memory providers declare {} in all",
            config::format_size(memory_total)
        );
    }
    // The retained store's period is a deadline too (gaps A-06).
    let extra = config.broker.retained.retention_period;
    let schedule = RetentionSchedule::for_channels(&all_settings, extra);
    let mut channels = Channels::new(Router::new(config), list);
    count_values_left_behind(&channels).await;
    let retained = &config.broker.retained;
    let provider = provider_named(config, providers, &retained.storage)
        .map_err(|e| format!("broker.retained.storage: {e}"))?;
    let durable =
        crate::broker::retained::Durable::open(provider, retained.retention_period, &channels)
            .await?;
    channels.retained = Some(durable);
    let session = &config.broker.session;
    let provider = provider_named(config, providers, &session.storage)
        .map_err(|e| format!("broker.session.storage: {e}"))?;
    let mut store = crate::broker::channels::SessionStore::open(provider).await?;
    // Every provider a channel or the broadcast log is on may hold some (B-441).
    let mut providers = channels.providers();
    if !providers.iter().any(|p| Arc::ptr_eq(p, &store.provider)) {
        providers.push(store.provider.clone());
    }
    store.read_held(&providers).await?;
    channels.sessions = Some(store);
    Ok((channels, schedule))
}

/// Logs, for each latest channel, how many stored values have topics its filter no
/// longer reaches: a filter edit moves nothing, so those values are served to
/// nobody, and `$saguin/kv/get` answers that their topic names no latest channel.
/// One value per topic makes the count cheap; append channels are not scanned, which
/// would mean reading the whole log, and the line says so.
async fn count_values_left_behind(channels: &Channels) {
    for (id, channel) in channels.iter() {
        if !matches!(channel.kind, Kind::Latest) {
            continue;
        }
        let mut left = 0u64;
        let mut example = None;
        let scanned = channel
            .provider
            .scan_stored(&channel.name, |r| {
                if channels.resolve(&r.topic) != Some(id) {
                    left += 1;
                    example.get_or_insert(r.topic);
                }
            })
            .await;
        match (scanned, example) {
            (Err(e), _) => log::error!(
                "latest channel {}: its stored values could not be read to count those its \
                 filter no longer reaches: {e}",
                channel.name
            ),
            (Ok(()), None) => log::debug!(
                "latest channel {}: every stored value's topic is one its filter {:?} reaches",
                channel.name,
                channel.filter
            ),
            (Ok(()), Some(topic)) => log::warn!(
                "latest channel {}: {left} stored values have topics its filter {:?} no \
                 longer reaches (such as {topic:?}); nothing serves them, and they stay \
                 until the channel's retention removes them. `saguin --route FILE TOPIC` says where such \
                 a topic goes now. Append channels are not checked: that would read their \
                 whole log",
                channel.name,
                channel.filter
            ),
        }
    }
}

/// The provider called `name`, opened at its first use.
fn provider_named<'c>(
    config: &'c Config,
    providers: &mut HashMap<&'c str, Arc<Provider>>,
    name: &'c str,
) -> Result<Arc<Provider>, String> {
    if let Some(p) = providers.get(name) {
        return Ok(p.clone());
    }
    let Some(declared) = config.broker.storage.providers.get(name) else {
        return Err(format!("no storage provider called {name}"));
    };
    let settings = provider_settings(config, declared);
    make_parent(&settings)?;
    let opened = Provider::open(&settings)
        .map_err(|e| format!("storage provider {}: {e}", declared.name))?;
    log::info!(
        "storage provider {} ({}) opened",
        declared.name,
        describe(&settings)
    );
    let opened = Arc::new(opened);
    providers.insert(name, opened.clone());
    Ok(opened)
}

/// A queue's settings as its owner runs them (RFC 0002 queue keys).
fn queue_policy(channel: &config::Channel) -> Option<crate::broker::queue::Policy> {
    use crate::broker::queue::{Backoff, Policy};
    let settings = channel
        .queue
        .as_ref()
        .filter(|_| channel.dlq_of.is_none())?;
    let base = settings.retry.backoff_base.unwrap_or_default();
    Some(Policy {
        filter: channel.filter.clone(),
        visibility_timeout: settings.visibility_timeout,
        job_expires_after: settings.job_expires_after,
        max_attempts: settings.retry.max_attempts,
        backoff: match settings.retry.backoff {
            config::Backoff::None => Backoff::None,
            config::Backoff::Linear => Backoff::Linear(base),
            config::Backoff::Exponential => Backoff::Exponential(base),
        },
    })
}

/// Creates the directory a provider keeps its files in, as `mkdir -p` would, so a
/// fresh device needs no step before its first start.
fn make_parent(settings: &ProviderSettings) -> Result<(), String> {
    let dir = match settings {
        ProviderSettings::Sqlite(s) => s.file_path.parent().map(std::path::Path::to_path_buf),
        ProviderSettings::Memory(m) => m.snapshot_dir.clone(),
    };
    match dir {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::create_dir_all(&dir).map_err(|e| {
            format!(
                "storage provider {}: cannot create {}: {e}",
                settings.name(),
                dir.display()
            )
        }),
        _ => Ok(()),
    }
}

fn describe(settings: &ProviderSettings) -> String {
    match settings {
        ProviderSettings::Sqlite(s) if s.max_bytes == u64::MAX => {
            format!("sqlite, {}, no max_bytes", s.file_path.display())
        }
        ProviderSettings::Sqlite(s) => format!(
            "sqlite, {}, max_bytes {}",
            s.file_path.display(),
            s.max_bytes
        ),
        ProviderSettings::Memory(m) => match &m.snapshot_dir {
            Some(dir) => format!(
                "memory, max_bytes {}, snapshots in {}",
                m.max_bytes,
                dir.display()
            ),
            None => format!("memory, max_bytes {}, no snapshots", m.max_bytes),
        },
    }
}

/// Refuses a bridge whose TLS files do not make a client configuration (B-210):
/// read as the start reads them, before any provider is opened or door bound, and
/// by `--check-config` alike, so the two refuse exactly the same files and a refused
/// start leaves nothing behind (B-185).
///
/// # Errors
/// Every refusal, each naming the bridge with its file and line.
pub fn refuse_unserved(config: &Config) -> Result<(), String> {
    let refusals: Vec<String> = config
        .bridges
        .iter()
        .filter_map(|bridge| {
            let at = &bridge.origin;
            crate::bridge::link::check_files(bridge)
                .err()
                .map(|e| format!("{}:{}: bridges.{}: {e}", at.file, at.line, bridge.name))
        })
        .collect();
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(refusals.join("\n"))
    }
}

/// Binds the MQTT doors `broker.mqtt.listen` names, each with its gate (`gates`
/// comes from [`crate::auth::Gates::from_config`] on the same configuration). A
/// configuration [`refuse_unserved`] refuses never gets here.
///
/// # Errors
/// A door that cannot be bound, named.
pub fn mqtt_doors(config: &Config, gates: &crate::auth::Gates) -> std::io::Result<Vec<Door>> {
    let mqtt = &config.broker.mqtt;
    let listen = &mqtt.listen;
    let tcp = tcp_doors("broker.mqtt.listen.tcp", &listen.tcp, &gates.tcp)?;
    let mut ws = Vec::new();
    for (door, (gate, policy)) in listen.ws.iter().zip(&gates.ws) {
        let addr = socket_addr("broker.mqtt.listen.ws", &door.name, &door.address)?;
        ws.push((addr, gate.clone(), policy.clone()));
    }
    let unix = unix_doors(&listen.unix, &gates.unix);
    crate::server::bind_doors(&tcp, &ws, &unix)
}

/// What this build refuses to start with rather than serve half of.
fn unserved(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::Unsupported, what)
}

/// Each tcp door's socket address beside its gate.
///
/// # Errors
/// A door whose address names a host rather than an IP address (`key` names the
/// block): it is not resolved, so the door would otherwise silently not open.
fn tcp_doors(
    key: &str,
    doors: &[config::TcpDoor],
    gates: &[Rc<Gate>],
) -> std::io::Result<Vec<(std::net::SocketAddr, Rc<Gate>)>> {
    doors
        .iter()
        .zip(gates)
        .map(|(door, gate)| Ok((socket_addr(key, &door.name, &door.address)?, gate.clone())))
        .collect()
}

/// A tcp or ws door's socket address: a host name is resolved here, at bind, and
/// its first IPv4 address taken, else its first (B-183, B-185).
///
/// # Errors
/// The host name does not resolve; the message names the door.
fn socket_addr(
    key: &str,
    name: &str,
    address: &config::ListenAddress,
) -> std::io::Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    if let Some(addr) = address.socket_addr() {
        return Ok(addr);
    }
    let host = address.bind_string();
    let resolved = host.to_socket_addrs().map_err(|e| {
        unserved(format!(
            "{key} {name}: {host} does not resolve ({e}); write an IP address (127.0.0.1 \
             for loopback, 0.0.0.0 for every interface)"
        ))
    })?;
    let resolved: Vec<std::net::SocketAddr> = resolved.collect();
    // IPv4 first: a gateway without IPv6 still resolves `localhost` to ::1.
    resolved
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| resolved.first())
        .copied()
        .ok_or_else(|| unserved(format!("{key} {name}: {host} resolves to no address")))
}

/// Each unix door's path and mode beside its gate.
fn unix_doors(
    doors: &[config::UnixDoor],
    gates: &[Rc<Gate>],
) -> Vec<(std::path::PathBuf, u32, Rc<Gate>)> {
    doors
        .iter()
        .zip(gates)
        .map(|(d, gate)| (d.path.clone(), d.mode, gate.clone()))
        .collect()
}

/// Binds every door of the operations listener, if `broker.operations` is written:
/// each tcp door and each unix door (with its `<path>.lock`, B-523), each with the
/// gate `gates` holds for it (its password file, its TLS; `crate::auth`). Which
/// doors may stay open without authenticating (B-361, B-362) and that none writes
/// `allow_anonymous` (B-364) is the configuration check's, in `config::blocks`.
///
/// # Errors
/// A door that cannot be bound, or a Unix socket another broker holds, named.
pub fn operations(
    config: &Config,
    gates: &crate::auth::Gates,
) -> std::io::Result<Option<OpsDoors>> {
    let Some(ops) = &config.broker.operations else {
        return Ok(None);
    };
    let tcp = tcp_doors(
        "broker.operations.listen.tcp",
        &ops.listen.tcp,
        &gates.ops_tcp,
    )?;
    let unix = unix_doors(&ops.listen.unix, &gates.ops_unix);
    Ok(Some(OpsDoors {
        doors: crate::server::bind_doors(&tcp, &[], &unix)?,
        min_scrape_interval: ops.min_scrape_interval,
    }))
}
