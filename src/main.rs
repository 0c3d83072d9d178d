//! The `ratekeeper` binary: parses the command line, loads the config, sets
//! up logging, turns signals into a shutdown future and reload requests, and
//! hands over to the library's [`App`].

mod commands;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tokio::sync::{mpsc, oneshot};

use ratekeeper::app::{self, App};
use ratekeeper::config::{self, Config};
use ratekeeper::logging;
use ratekeeper::tokens::Provider;

const EXIT_CODES: &str = "Exit codes: 0 success, 1 failure (bad config, daemon unreachable, \
error answer), 2 usage error.";

#[derive(Parser)]
#[command(
    name = "ratekeeper",
    version = env!("RATEKEEPER_VERSION"),
    about = "One shared, exact rate limit for every worker that calls an LLM API.",
    long_about = "ratekeeper is a sidecar daemon: workers ask it over a Unix socket for tokens \
before calling an LLM provider, and every sidecar draws from the same buckets in Redis \
(or, without Redis, from buckets in this process).",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon.
    #[command(
        after_help = "The config is validated exactly as by check-config before anything \
starts. SIGTERM or SIGINT drains in-flight requests and removes the socket. SIGHUP reloads \
the config file (limits, groups, priority classes); a config that fails validation is logged \
and the running one kept.\n\n\
Exit codes: 0 clean shutdown, 1 invalid config or socket unavailable."
    )]
    Serve {
        /// TOML config file; without one the daemon serves no limits.
        #[arg(long, short, env = "RATEKEEPER_CONFIG")]
        config: Option<PathBuf>,
        #[command(flatten)]
        logging: LoggingArgs,
    },
    /// Validate a config file and print the effective configuration.
    #[command(
        after_help = "Every mistake in the file is reported in one run, each with its line \
and column, an unknown key or value with the one it most likely misspells. Environment \
overrides (RATEKEEPER_SOCKET, RATEKEEPER_REDIS_URL) apply as in serve.\n\n\
Exit codes: 0 valid, 1 invalid or unreadable."
    )]
    CheckConfig {
        /// The TOML config file to check.
        #[arg(value_name = "FILE", required_unless_present = "config")]
        file: Option<PathBuf>,
        /// The config file as serve takes it (FILE, when given, wins).
        #[arg(long, short, env = "RATEKEEPER_CONFIG", hide_env_values = true)]
        config: Option<PathBuf>,
    },
    /// Show the store's state and every limit's buckets: level, capacity,
    /// rate, percent full, tenants, waiters.
    #[command(
        after_help = "Answers while the store is down: with on_failure = \"local\" it shows \
the local buckets acquires are granted from, otherwise the levels are unknown.\n\n\
Exit codes: 0 answered, 1 failure (daemon unreachable, error answer), 2 usage error."
    )]
    Status {
        #[command(flatten)]
        socket: SocketArgs,
        /// Show only this limit.
        #[arg(long)]
        limit: Option<String>,
        /// Print JSON (one object; one line per redraw with --watch).
        #[arg(long)]
        json: bool,
        /// Redraw every SECS seconds (default 2; 0.01 to 86400) until interrupted.
        #[arg(
            long,
            value_name = "SECS",
            num_args = 0..=1,
            default_missing_value = "2",
            value_parser = commands::watch_interval
        )]
        watch: Option<Duration>,
    },
    /// Check that the daemon can serve acquires (readiness), for exec probes.
    #[command(
        after_help = "Ready means the socket answers and the store answers, or the \
configured failure policy (fail_open, local) grants in its place; the reason is printed.\n\n\
Exit codes: 0 ready, 1 not ready or unreachable, 2 usage error."
    )]
    Health {
        #[command(flatten)]
        socket: SocketArgs,
    },
    /// Check that the daemon answers.
    #[command(after_help = EXIT_CODES)]
    Ping {
        #[command(flatten)]
        socket: SocketArgs,
    },
    /// Acquire tokens from a limit, for shell scripts and debugging.
    #[command(after_help = acquire_help())]
    Acquire {
        #[command(flatten)]
        socket: SocketArgs,
        #[command(flatten)]
        args: Box<commands::AcquireArgs>,
    },
    /// Count the prompt tokens of a request read on stdin (OpenAI's or Anthropic's), as the daemon would.
    #[command(after_help = count_tokens_help())]
    CountTokens {
        /// Model whose tokenizer counts (e.g. gpt-4o-mini, gpt-4, claude-sonnet-4-5);
        /// default: the request's "model".
        #[arg(long)]
        model: Option<String>,
        /// Provider preset: the tokenizer and the cost rule (anthropic also reads a
        /// `messages` request as Anthropic's).
        #[arg(long, value_enum, default_value_t = ProviderArg::Generic)]
        provider: ProviderArg,
        /// Whose shape a `messages` request is (default: anthropic under
        /// --provider anthropic, else told from the request, as the Python
        /// client's api=None does).
        #[arg(long, value_enum)]
        api: Option<commands::ApiArg>,
        /// Output tokens to reserve, instead of the request's max_tokens.
        #[arg(long, value_name = "N")]
        max_tokens: Option<u64>,
    },
    /// Print a shell completion script for ratekeeper.
    #[command(after_help = "For example: `ratekeeper completions bash > \
~/.local/share/bash-completion/completions/ratekeeper`, `ratekeeper completions zsh > \
\"${fpath[1]}/_ratekeeper\"`, `ratekeeper completions fish > \
~/.config/fish/completions/ratekeeper.fish`.")]
    Completions {
        /// The shell to complete in.
        shell: clap_complete::Shell,
    },
}

fn acquire_help() -> String {
    format!(
        "Give the cost as --tokens (the total: prompt plus maximum output), as --input and/or \
--output (each side on its own), or as --messages-file (a request in JSON, counted by the \
daemon with the limit's tokenizer). Prints the decision. Without --report, \
--report-input/--report-output or --release the reservation is kept when the command exits, \
as for any worker that disconnects after its grant: use it before a provider call made by the \
script itself.\n\n\
--messages-file: {}\n\n\
Exit codes: 0 granted, 3 denied (rate limited), 1 error, 2 usage error.",
        commands::REQUEST_SHAPES
    )
}

fn count_tokens_help() -> String {
    format!(
        "Reads a request on stdin. {} --model, when given, overrides the request's \"model\". \
Prints the prompt tokens (messages + tools, and the images and Anthropic tool-use prompt \
priced beyond text), the output tokens reserved (--max-tokens, else the request's \
max_tokens or max_output_tokens, else the default of {}) and what an acquire reserves under \
the provider's preset: openai charges max(prompt, output), anthropic and generic prompt + \
output. No daemon is needed.\n\n\
Exit codes: 0 counted, 1 bad JSON, a request that cannot be counted, a prompt above the \
bounds, or a model openai cannot count.",
        commands::REQUEST_SHAPES,
        config::DEFAULT_MAX_OUTPUT_TOKENS
    )
}

#[derive(clap::Args)]
struct SocketArgs {
    /// Path of the daemon's Unix socket [default: $XDG_RUNTIME_DIR/ratekeeper.sock,
    /// else /run/ratekeeper/ratekeeper.sock]
    #[arg(long, short, env = config::ENV_SOCKET, default_value_os_t = config::default_socket_path(), hide_default_value = true)]
    socket: PathBuf,
}

#[derive(clap::Args)]
struct LoggingArgs {
    /// Log format on stderr.
    #[arg(long, env = "RATEKEEPER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log filter, e.g. `info` or `ratekeeper=debug` [default: info, or
    /// RATEKEEPER_LOG_LEVEL for ratekeeper's own logs]. RUST_LOG, when set,
    /// overrides both.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
}

/// `--provider` of count-tokens.
#[derive(Clone, Copy, ValueEnum)]
enum ProviderArg {
    Openai,
    Anthropic,
    Generic,
}

impl From<ProviderArg> for Provider {
    fn from(provider: ProviderArg) -> Self {
        match provider {
            ProviderArg::Openai => Provider::Openai,
            ProviderArg::Anthropic => Provider::Anthropic,
            ProviderArg::Generic => Provider::Generic,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The daemon's runtime has the threads its config asks for; a one-shot
    // command needs one.
    let (threads, loaded) = match &cli.command {
        Command::Serve { config, .. } => match load_config(config.as_deref()) {
            Ok(loaded) => (loaded.server.threads, Some(loaded)),
            Err(failure) => {
                say(&format!("ratekeeper: {}", described(&failure)));
                return ExitCode::FAILURE;
            }
        },
        _ => (1, None),
    };
    let runtime = match app::runtime_builder(threads).build() {
        Ok(runtime) => runtime,
        Err(runtime_error) => {
            say(&format!(
                "ratekeeper: cannot start the async runtime: {runtime_error}"
            ));
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli, loaded)) {
        Ok(code) => code,
        Err(failure) => {
            say(&format!("ratekeeper: {}", described(&failure)));
            ExitCode::FAILURE
        }
    }
}

/// Runs the command; `serve` gets its config already loaded.
async fn run(cli: Cli, loaded: Option<Config>) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve { config, logging } => {
            let loaded = match loaded {
                Some(loaded) => loaded,
                None => load_config(config.as_deref())?,
            };
            serve(loaded, config.as_deref(), &logging).await
        }
        Command::CheckConfig { file, config } => {
            // clap requires one of the two.
            let Some(file) = file.or(config) else {
                return Ok(ExitCode::from(2));
            };
            let config = load_config(Some(&file))?;
            print!("{}", config.to_effective_toml());
            for warning in config.warnings() {
                say(&format!("{}: warning: {warning}", file.display()));
            }
            say(&format!("{}: valid", file.display()));
            Ok(ExitCode::SUCCESS)
        }
        Command::Status {
            socket,
            limit,
            json,
            watch,
        } => {
            let options = commands::StatusOptions { limit, json, watch };
            commands::status(&socket.socket, options).await
        }
        Command::Health { socket } => commands::health(&socket.socket).await,
        Command::CountTokens {
            model,
            provider,
            api,
            max_tokens,
        } => commands::count_tokens(
            model.as_deref(),
            provider.into(),
            api.map(Into::into),
            max_tokens,
        ),
        Command::Ping { socket } => commands::ping(&socket.socket).await,
        Command::Acquire { socket, args } => commands::acquire(&socket.socket, *args).await,
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "ratekeeper", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A line on stderr; a closed stderr must not turn an exit code into a panic.
/// `failure` and its causes, each said once: many errors already quote
/// their cause in their own message (`cannot bind X: Address in use`), and
/// anyhow's `{:#}` would print the OS error a second time (issue 28).
fn described(failure: &anyhow::Error) -> String {
    let mut said = String::new();
    for cause in failure.chain() {
        let cause = cause.to_string();
        if said.contains(&cause) {
            continue;
        }
        if !said.is_empty() {
            said.push_str(": ");
        }
        said.push_str(&cause);
    }
    said
}

fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn load_config(path: Option<&Path>) -> anyhow::Result<Config> {
    app::load_config(path).context("invalid configuration")
}

async fn serve(
    config: Config,
    config_path: Option<&Path>,
    logging: &LoggingArgs,
) -> anyhow::Result<ExitCode> {
    init_logging(logging)?;
    let mut app = App::new(config, config_path.map(Path::to_path_buf))?;
    // Signal handlers go in before the socket exists: a client that sees the
    // socket may signal the daemon at once.
    let (shutdown, reloads) = watch_signals()?;
    tokio::spawn(return_freed_memory());
    app.warm_up().await;
    let listener = app.bind()?;
    app.serve(listener, shutdown, reloads).await;
    Ok(ExitCode::SUCCESS)
}

/// mimalloc hands pages freed by a thread back to the system only when that
/// thread next allocates or frees: an idle daemon kept what its last burst
/// (a flood of half-read 4 MiB frames) had used, 100 MiB in the soak. A
/// collection each second returns what has been free longer than mimalloc's
/// purge delay; on a multi-thread runtime it reaches the heap of whichever
/// worker runs it.
async fn return_freed_memory() {
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        // SAFETY: mi_collect has no preconditions; `false` only frees what
        // is already free, without forcing purges.
        unsafe { libmimalloc_sys::mi_collect(false) };
    }
}

/// The first SIGTERM or SIGINT completes the returned future; every SIGHUP
/// sends a reload request. signal-hook's iterator runs on a thread of its
/// own and hands each signal to the runtime over a channel.
fn watch_signals() -> anyhow::Result<(impl Future<Output = ()>, mpsc::UnboundedReceiver<()>)> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .context("cannot install signal handlers")?;
    let (reload, reloads) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut stop = Some(stop);
            for signal in signals.forever() {
                if signal == SIGHUP {
                    let _ = reload.send(());
                } else if let Some(stop) = stop.take() {
                    tracing::info!(signal, "shutdown requested");
                    let _ = stop.send(());
                }
            }
        })
        .context("cannot start the signal thread")?;
    Ok((
        async move {
            let _ = stopped.await;
        },
        reloads,
    ))
}

fn init_logging(logging: &LoggingArgs) -> anyhow::Result<()> {
    let format = match logging.log_format {
        LogFormat::Text => logging::LogFormat::Text,
        LogFormat::Json => logging::LogFormat::Json,
    };
    let level = std::env::var(logging::ENV_LOG_LEVEL).ok();
    let filter = logging::default_filter(logging.log_level.as_deref(), level.as_deref())?;
    logging::init(format, &filter).context("invalid --log-level")?;
    Ok(())
}
