//! `saguin`: the broker's command line.

use std::path::PathBuf;
use std::process::ExitCode;

use argh::FromArgs;
use futures_lite::StreamExt;

/// Sagüin: an MQTT 5 and 3.1.1 broker for edge gateways, with durable channels.
#[derive(FromArgs)]
struct Args {
    /// serve with this configuration file (there is no implicit one)
    #[argh(option)]
    config: Option<PathBuf>,
    /// validate this configuration file, touching no storage and no socket, and exit
    #[argh(option)]
    check_config: Option<PathBuf>,
    /// with --check-config: print the configuration as it resolved, to stdout
    #[argh(switch)]
    output: bool,
    /// answer where topics land under this configuration: the operand, or one per
    /// line on standard input
    #[argh(option)]
    route: Option<PathBuf>,
    /// answer what user names may do under this configuration's acl_file: the
    /// operands USER [CLIENT-ID], or one user name (and client id) per line on
    /// standard input
    #[argh(option)]
    acl: Option<PathBuf>,
    /// with --route or --acl: answer as JSON
    #[argh(switch)]
    json: bool,
    /// manage a Mosquitto-format password file and exit: list FILE, add FILE USER
    /// [PASSWORD] (prompts when it is not given), delete FILE USER
    #[argh(option)]
    passwd: Option<String>,
    /// print the licences of the code in this binary and exit
    #[argh(switch)]
    licenses: bool,
    /// with --route, the topic or filter to answer; with --acl, the user name and
    /// client id; with --passwd, the file and user
    #[argh(positional)]
    operands: Vec<String>,
}

// Both C libraries' allocators give freed memory back to the kernel sooner than a
// broker relaying 16 KiB messages can afford: it then faults fresh pages in for nearly
// every payload (BENCHMARKS.md, the sessions on `mallopt` and on mimalloc).
//
// The static gateway builds link musl, whose malloc has no knob for it: mimalloc
// serves them instead: 1.4-2x musl's rate in 7 of the 8 1-to-1 and 8-to-1 rows. Its
// `override` feature (Cargo.toml) replaces C's `malloc` in the static link as well, so
// SQLite allocates through it too: 1.3x the queue drain.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// glibc hands the top of its heap back once 128 KiB of it is free; it keeps up to
/// 1 MiB instead: a tenth of the time on 1-to-1 16 KiB, 1.23x the rate once kept.
/// (mimalloc on glibc gained nothing over this.)
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_allocator() {
    const KEEP_TOP_BYTES: libc::c_int = 1 << 20;
    // SAFETY: mallopt only sets a parameter of glibc's malloc, under its own lock; a
    // refusal (0) leaves the default in place.
    if unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, KEEP_TOP_BYTES) } == 0 {
        log::debug!("mallopt(M_TRIM_THRESHOLD) refused; glibc's default stays");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_allocator() {}

fn licenses() -> ExitCode {
    let mut out = std::io::stdout().lock();
    match saguin::licenses::write(&mut out).and_then(|()| std::io::Write::flush(&mut out)) {
        Ok(()) => ExitCode::SUCCESS,
        // `saguin --licenses | head` is a reader that has seen enough.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("saguin: writing the licences: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args: Args = argh::from_env();
    // B-564: before any configuration is read.
    if args.licenses {
        return licenses();
    }
    if args.output && args.check_config.is_none() {
        eprintln!("saguin: --output is given with --check-config and refused without it");
        return ExitCode::from(2);
    }
    if args.json && args.route.is_none() && args.acl.is_none() {
        eprintln!("saguin: --json answers --route or --acl and is refused without them");
        return ExitCode::from(2);
    }
    if let Some(verb) = &args.passwd {
        return passwd(verb, &args.operands);
    }
    if let Some(path) = args.check_config {
        return check_config(&path, args.output);
    }
    if let Some(path) = args.acl {
        return acl(&path, &args.operands, args.json);
    }
    if let Some(path) = args.route {
        let subject = match args.operands.as_slice() {
            [] => None,
            [subject] => Some(subject.as_str()),
            _ => {
                eprintln!("saguin: --route answers one topic or filter, or a list on stdin");
                return ExitCode::from(2);
            }
        };
        return route(&path, subject, args.json);
    }
    if !args.operands.is_empty() {
        eprintln!(
            "saguin: {:?} is not an option; see saguin --help",
            args.operands[0]
        );
        return ExitCode::from(2);
    }
    let Some(path) = args.config else {
        eprintln!("saguin: no configuration file given; start it as `saguin --config <file>`");
        return ExitCode::from(2);
    };
    let config = match load(&path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    // B-185: what --check-config refuses, refused before any provider is opened or
    // door bound, in the same words.
    if let Err(code) = refuse_unserved(&config) {
        return code;
    }
    init_logging(config.broker.log_level, &config.broker.id);
    tune_allocator();
    // B-248: a door beside the acl_file that identifies nobody is warned about at
    // the start as well as by --check-config.
    for note in config.notes.iter().filter(|n| n.contains("acl_file")) {
        log::warn!("{note}");
    }
    // B-504: a provider nothing names is said to be inert once, at the start.
    for note in config.notes.iter().filter(|n| n.contains("inert")) {
        log::info!("{note}");
    }
    let settings = saguin::broker::Settings::from_config(&config);
    // Certificates, keys and password files are read before any storage is opened:
    // a start they refuse changes nothing on the disk (B-185).
    let gates = match saguin::auth::Gates::from_config(&config) {
        Ok(gates) => gates,
        Err(found) => {
            // Every one, not the first (B-480).
            for finding in &found.0 {
                log::error!("{finding}");
            }
            return ExitCode::FAILURE;
        }
    };
    let (channels, sweeps) = match smol::block_on(saguin::startup::open_channels(&config)) {
        Ok(opened) => opened,
        Err(e) => {
            log::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    saguin::auth::warn_closed_doors(&gates);
    // From here a start that fails closes the providers it opened.
    let failed = |e: &dyn std::fmt::Display| {
        log::error!("{e}");
        saguin::startup::close_providers(&channels.providers());
        ExitCode::FAILURE
    };
    let listeners = match saguin::startup::mqtt_doors(&config, &gates) {
        Ok(doors) => doors,
        Err(e) => return failed(&e),
    };
    let operations = match saguin::startup::operations(&config, &gates) {
        Ok(operations) => operations,
        Err(e) => return failed(&e),
    };
    let signals = match async_signal::Signals::new([
        async_signal::Signal::Term,
        async_signal::Signal::Int,
        async_signal::Signal::Hup,
        async_signal::Signal::Usr1,
    ]) {
        Ok(signals) => signals,
        Err(e) => return failed(&format_args!("cannot install signal handlers: {e}")),
    };
    // Written after the handlers, so a supervisor that signals at once finds them.
    let pid_file = config.broker.pid_file.clone();
    if let Some(pid_file) = &pid_file
        && let Err(e) = std::fs::write(pid_file, format!("{}\n", std::process::id()))
    {
        return failed(&format_args!(
            "broker.pid_file {}: {e}; not running unmanaged",
            pid_file.display()
        ));
    }
    log::info!(
        "saguin {} starting as {}",
        env!("CARGO_PKG_VERSION"),
        settings.broker_id
    );
    let served = saguin::server::serve(
        settings,
        listeners,
        channels,
        sweeps,
        operations,
        config.bridges.clone(),
        stop_signal(signals, path, config.broker.log_level, gates),
    );
    if let Some(pid_file) = &pid_file {
        let _ = std::fs::remove_file(pid_file);
    }
    match served {
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

/// Loads and validates a configuration, every file it names included; findings go to
/// stderr.
fn load(path: &std::path::Path) -> Result<saguin::config::Config, ExitCode> {
    let config = saguin::config::load(path).map_err(|e| {
        eprintln!("{e}");
        ExitCode::from(2)
    })?;
    let loaded = check_loaded(&config);
    if loaded.is_err() {
        // The gates' findings too, as --check-config gives them (B-480); a start
        // that gets past here reads them once, for real.
        let _ = check_gates(&config, path, &loaded);
        return Err(ExitCode::from(2));
    }
    Ok(config)
}

/// What a configuration that loaded still needs: every file it names readable, and
/// its acl_file valid against its channels; each refusal on stderr.
fn check_loaded(config: &saguin::config::Config) -> Result<(), Unloaded> {
    // Every stage that can still run does, so one refusal hides no other (B-480):
    // only what would repeat an unreadable file's finding is left out.
    let files = config.check_files();
    if let Err(e) = &files {
        eprintln!("{e}");
    }
    // The acl_file is validated against the channels, with its own file and lines.
    // One check_files said it cannot read is not read again (it would say so twice).
    let acl_readable = (config.broker.mqtt.acl_file.as_ref())
        .is_none_or(|p| p.is_file() && std::fs::File::open(p).is_ok());
    let acl = match acl_readable {
        true => saguin::config::acl::load(config)
            .map(drop)
            .map_err(|e| e.to_string())
            .inspect_err(|e| eprintln!("{e}")),
        false => Ok(()),
    };
    match (files, acl) {
        (Ok(()), Ok(())) => Ok(()),
        (files, acl) => Err(Unloaded {
            files_read: files.is_ok(),
            acl_said: acl.err(),
        }),
    }
}

/// What [`check_loaded`] refused: whether every named file read, and the acl_file's
/// findings as said.
struct Unloaded {
    files_read: bool,
    acl_said: Option<String>,
}

/// What a start reads before it serves, read the same way: a certificate that is
/// not PEM, a key that is not its certificate's, a password file with a line it
/// cannot take (B-551, B-552), every one (B-480); not once a file it names could not
/// be read, and not the acl_file's findings [`check_loaded`] said already.
fn check_gates(
    config: &saguin::config::Config,
    path: &std::path::Path,
    loaded: &Result<(), Unloaded>,
) -> Result<(), ExitCode> {
    let acl_said = match loaded {
        Ok(()) => None,
        Err(u) if u.files_read => u.acl_said.as_ref(),
        Err(_) => return Err(ExitCode::from(2)),
    };
    let Err(mut found) = saguin::auth::Gates::from_config(config) else {
        return loaded.as_ref().map_err(|_| ExitCode::from(2)).copied();
    };
    found.0.retain(|f| Some(f) != acl_said);
    if !found.0.is_empty() {
        eprintln!(
            "configuration is invalid:\n{}:\n  - {found}",
            path.display()
        );
    }
    Err(ExitCode::from(2))
}

/// What this build validates but does not run, refused by `--check-config` and a
/// plain start alike (B-185), on stderr like every other refusal of the file.
fn refuse_unserved(config: &saguin::config::Config) -> Result<(), ExitCode> {
    saguin::startup::refuse_unserved(config).map_err(|e| {
        eprintln!("{e}");
        ExitCode::from(2)
    })
}

/// `--passwd VERB FILE [USER [PASSWORD]]`: edits the file and nothing else.
fn passwd(verb: &str, operands: &[String]) -> ExitCode {
    let Some((file, rest)) = operands.split_first() else {
        eprintln!("{}", saguin::auth::passwd::USAGE);
        return ExitCode::from(2);
    };
    let command = match saguin::auth::passwd::Command::parse(verb, rest) {
        Ok(command) => command,
        Err(usage) => {
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    match saguin::auth::passwd::run(std::path::Path::new(file), command) {
        Ok(said) => {
            print!("{said}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("saguin --passwd: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--check-config FILE [--output]`: the summary to stderr, the resolved document to
/// stdout, exit 0 only when nothing is wrong.
fn check_config(path: &std::path::Path, output: bool) -> ExitCode {
    let config = match saguin::config::load(path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // The resolved document has stdout to itself (B-554), and is printed even when a
    // file it names is missing, the findings going to stderr (B-558).
    if output {
        print!("{}", saguin::config::render(&config));
    }
    let loaded = check_loaded(&config);
    let read = check_gates(&config, path, &loaded);
    let served = refuse_unserved(&config);
    if let Err(code) = read.and(served) {
        return code;
    }
    // The summary is the answer on stdout (B-550), or on stderr beside the document.
    let summary = saguin::config::summary(&config);
    if output {
        eprint!("{summary}");
    } else {
        print!("{summary}");
    }
    ExitCode::SUCCESS
}

/// `--route FILE [SUBJECT] [--json]`: the same routing the broker runs.
fn route(path: &std::path::Path, subject: Option<&str>, json: bool) -> ExitCode {
    let config = match saguin::config::load(path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let router = saguin::routing::Router::new(&config);
    match subject {
        Some(subject) if json => print!("{}", saguin::routing::explain_one_json(&router, subject)),
        Some(subject) => print!("{}", saguin::routing::explain_one(&router, subject)),
        None => {
            let mut input = String::new();
            if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut input) {
                eprintln!("saguin: cannot read subjects from stdin: {e}");
                return ExitCode::from(2);
            }
            let subjects = saguin::routing::read_subjects(&input);
            if json {
                print!("{}", saguin::routing::explain_json(&router, &subjects));
            } else {
                print!("{}", saguin::routing::explain(&router, &subjects));
            }
        }
    }
    ExitCode::SUCCESS
}

/// `--acl FILE [USER [CLIENT-ID]] [--json]`: the same policy and entry the broker
/// resolves (RFC 0002 "Explaining a decision: --acl").
fn acl(path: &std::path::Path, operands: &[String], json: bool) -> ExitCode {
    use saguin::acl::explain;
    let config = match load(path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let policy = match saguin::config::acl::load(&config) {
        Ok(Some(policy)) => policy,
        Ok(None) => {
            print!("{}", explain::explain_unrestricted(&config, json));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match operands {
        [] => {
            let mut input = String::new();
            if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut input) {
                eprintln!("saguin: cannot read user names from stdin: {e}");
                return ExitCode::from(2);
            }
            print!("{}", explain::explain_list(&policy, &config, &input, json));
            if policy.uses_client_id() {
                // B-258: said where a rule uses %c, and kept off the rows.
                eprintln!("{}", explain::CLIENT_ID_NOTE);
            }
        }
        [user] | [user, _] => {
            let client = operands.get(1).map(String::as_str);
            if json {
                print!("{}", explain::explain_one_json(&policy, user, client));
            } else {
                print!("{}", explain::explain_one(&policy, user, client));
            }
        }
        _ => {
            eprintln!("saguin: --acl answers one user name (and client id), or a list on stdin");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}

/// Resolves at SIGTERM or SIGINT. SIGHUP is logged and ignored: the configuration is
/// not reloaded in place. SIGUSR1 re-reads the log level and the ws doors' origins,
/// and every password file and certificate from the paths the broker started with.
async fn stop_signal(
    mut signals: async_signal::Signals,
    config: PathBuf,
    mut level: saguin::config::LogLevel,
    gates: saguin::auth::Gates,
) {
    while let Some(signal) = signals.next().await {
        match signal {
            Ok(async_signal::Signal::Hup) => {
                log::warn!("SIGHUP ignored: restart the broker to apply a changed configuration");
            }
            Ok(async_signal::Signal::Usr1) => {
                // A configuration that does not load changes nothing, the files it
                // names included: an edit is likelier under way than done (RFC 0002).
                if let Some(new) = reload_configuration(&config, level, &gates) {
                    level = new;
                    gates.reloader.reload();
                }
            }
            Ok(signal) => {
                log::info!("{signal:?} received");
                return;
            }
            Err(e) => log::warn!("signal handling: {e}"),
        }
    }
}

/// SIGUSR1: re-reads `broker.log_level` (unless `SAGUIN_LOG` set the level for this
/// run) and each ws door's `same_origin` and `allowed_origins` (B-168). `None`: the
/// file does not load, and nothing changed, because the likeliest reason is
/// somebody still typing (RFC 0002).
fn reload_configuration(
    path: &std::path::Path,
    old: saguin::config::LogLevel,
    gates: &saguin::auth::Gates,
) -> Option<saguin::config::LogLevel> {
    match saguin::config::load(path) {
        Ok(config) => {
            let new = config.broker.log_level;
            if std::env::var_os("SAGUIN_LOG").is_some() {
                log::warn!(
                    "SIGUSR1: log_level {} left alone: SAGUIN_LOG sets the level for this run; \
                     addresses and storage are read at startup only",
                    new.as_str()
                );
            } else {
                // Said at the more talkative of the two levels: moving to `error` it
                // would not be said at all, moving from it neither.
                log::set_max_level(old.to_level_filter().max(new.to_level_filter()));
                log::warn!(
                    "SIGUSR1: log_level {} -> {}; addresses and storage are read at startup only",
                    old.as_str(),
                    new.as_str()
                );
                log::set_max_level(new.to_level_filter());
            }
            for door in &config.broker.mqtt.listen.ws {
                let policy = gates
                    .ws
                    .iter()
                    .map(|(_, p)| p)
                    .find(|p| p.name() == door.name);
                if let Some(policy) = policy {
                    policy.replace(door.same_origin, &door.allowed_origins);
                }
            }
            Some(new)
        }
        Err(e) => {
            log::warn!(
                "SIGUSR1: {} does not load, so nothing changed (password files, \
                 certificates and the acl_file included):\n{e}",
                path.display()
            );
            None
        }
    }
}

/// Logs to standard output, which the init system bounds (RFC 0002: no log_file).
/// Every line names the broker by `broker.id` (B-016), so the lines of several
/// gateways gathered in one place stay apart. `SAGUIN_LOG` overrides the level for
/// one run.
fn init_logging(level: saguin::config::LogLevel, broker_id: &str) {
    use std::io::Write;
    let overridden = std::env::var_os("SAGUIN_LOG").is_some();
    let id = broker_id.to_owned();
    env_logger::Builder::new()
        // `log::max_level` filters, so SIGUSR1 can move it; a SAGUIN_LOG naming
        // modules only leaves the rest at the configured level, not at trace.
        .filter_level(if overridden {
            level.to_level_filter()
        } else {
            log::LevelFilter::Trace
        })
        .parse_env(env_logger::Env::default().filter("SAGUIN_LOG"))
        .format(move |buf, record| {
            writeln!(
                buf,
                "[{} {:<5} {id}] {}",
                buf.timestamp_millis(),
                record.level(),
                record.args()
            )
        })
        .target(env_logger::Target::Stdout)
        .init();
    if !overridden {
        log::set_max_level(level.to_level_filter());
    }
}
