//! `saguin`: the broker's command line.

use std::path::PathBuf;
use std::process::ExitCode;

use argh::FromArgs;
use futures_lite::StreamExt;

/// Sagüin: an MQTT 5 and 3.1.1 broker for edge gateways, with durable channels.
#[derive(FromArgs)]
struct Args {
    /// the configuration file (required: there is no implicit one)
    #[argh(option)]
    config: Option<PathBuf>,
    /// validate the configuration and exit
    #[argh(switch)]
    check_config: bool,
}

fn main() -> ExitCode {
    let args: Args = argh::from_env();
    let Some(path) = args.config else {
        eprintln!("saguin: no configuration file given; start it as `saguin --config <file>`");
        return ExitCode::from(2);
    };
    let config = match saguin::config::load(&path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if args.check_config {
        println!("{}: configuration is valid", path.display());
        return ExitCode::SUCCESS;
    }
    init_logging(config.broker.log_level);
    let settings = saguin::broker::Settings::from_config(&config);
    let channels = match smol::block_on(saguin::startup::open_channels(&config)) {
        Ok(channels) => channels,
        Err(e) => {
            log::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let addrs = config.broker.mqtt.plain_tcp_addrs();
    let listeners = match saguin::server::bind(&addrs) {
        Ok(listeners) => listeners,
        Err(e) => {
            log::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let operations = match saguin::startup::operations(&config) {
        Ok(operations) => operations,
        Err(e) => {
            log::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let signals = match async_signal::Signals::new([
        async_signal::Signal::Term,
        async_signal::Signal::Int,
        async_signal::Signal::Hup,
    ]) {
        Ok(signals) => signals,
        Err(e) => {
            log::error!("cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    log::info!(
        "saguin {} starting as {}",
        env!("CARGO_PKG_VERSION"),
        settings.broker_id
    );
    match saguin::server::serve(
        settings,
        listeners,
        channels,
        operations,
        stop_signal(signals),
    ) {
        Ok(()) => {
            log::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            log::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves at SIGTERM or SIGINT. SIGHUP is logged and ignored: the configuration is
/// not reloaded in place.
async fn stop_signal(mut signals: async_signal::Signals) {
    while let Some(signal) = signals.next().await {
        match signal {
            Ok(async_signal::Signal::Hup) => {
                log::warn!("SIGHUP ignored: restart the broker to apply a changed configuration");
            }
            Ok(signal) => {
                log::info!("{signal:?} received");
                return;
            }
            Err(e) => log::warn!("signal handling: {e}"),
        }
    }
}

fn init_logging(level: saguin::config::LogLevel) {
    use saguin::config::LogLevel;
    let filter = match level {
        LogLevel::Debug => log::LevelFilter::Debug,
        LogLevel::Info => log::LevelFilter::Info,
        LogLevel::Warn => log::LevelFilter::Warn,
        LogLevel::Error => log::LevelFilter::Error,
    };
    env_logger::Builder::new()
        .filter_level(filter)
        .parse_env(env_logger::Env::default().filter("SAGUIN_LOG"))
        .format_timestamp_millis()
        .init();
}
