//! The `ratekeeper` binary: parses the command line, loads the config, sets
//! up logging and signals, and hands over to the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use futures_util::StreamExt;

use ratekeeper::client::Client;
use ratekeeper::config::{self, Config, Provider};
use ratekeeper::dispatch::Dispatcher;
use ratekeeper::limiter::{EmbeddedStore, FailFastStore, FallbackStore, RedisStore, Store};
use ratekeeper::proto::{Acquire, Cost, ErrorCode, Request, Response};
use ratekeeper::server::{self, ServerSettings};
use ratekeeper::tokens::{self, CharEstimator};

/// Exit code of `acquire` when the request was denied (rate limited).
const EXIT_DENIED: u8 = 3;

const EXIT_CODES: &str = "Exit codes: 0 success, 1 failure (bad config, daemon unreachable, \
error answer), 2 usage error.";

#[derive(Parser)]
#[command(
    name = "ratekeeper",
    version,
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
        after_help = "Every mistake is reported with its line and column. Environment \
overrides (RATEKEEPER_SOCKET, RATEKEEPER_REDIS_URL) apply as in serve.\n\n\
Exit codes: 0 valid, 1 invalid or unreadable."
    )]
    CheckConfig {
        /// The TOML config file to check.
        file: PathBuf,
    },
    /// Show every limit's buckets: level, capacity, rate and waiters.
    #[command(after_help = EXIT_CODES)]
    Status {
        #[command(flatten)]
        socket: SocketArgs,
        /// Show only this limit.
        #[arg(long)]
        limit: Option<String>,
    },
    /// Check that the daemon answers.
    #[command(after_help = EXIT_CODES)]
    Ping {
        #[command(flatten)]
        socket: SocketArgs,
    },
    /// Acquire tokens from a limit, for shell scripts and debugging.
    #[command(
        after_help = "Prints the decision. Without --report or --release the reservation \
is kept when the command exits, as for any worker that disconnects after its grant: use it \
before a provider call made by the script itself.\n\n\
Exit codes: 0 granted, 3 denied (rate limited), 1 error, 2 usage error."
    )]
    Acquire {
        #[command(flatten)]
        socket: SocketArgs,
        /// The limit to draw from.
        limit: String,
        /// Tokens to reserve (prompt plus maximum output).
        #[arg(long)]
        tokens: u64,
        /// Longest acceptable wait in milliseconds (default: the priority class's).
        #[arg(long, value_name = "MS")]
        max_wait: Option<u64>,
        /// Also draw from this tenant's share.
        #[arg(long)]
        tenant: Option<String>,
        /// Priority class (default: the configured default class).
        #[arg(long)]
        priority: Option<String>,
        /// Settle the lease with this actual usage right after the grant.
        #[arg(long, value_name = "USED")]
        report: Option<u64>,
        /// Give the reservation back right after the grant (a dry run).
        #[arg(long, conflicts_with = "report")]
        release: bool,
    },
    /// Count the prompt tokens of a chat request read on stdin, as the daemon would.
    #[command(
        after_help = "Reads an OpenAI-shaped chat request on stdin: {\"messages\": [...], \
\"tools\": [...], \"max_tokens\": N}, or just the messages array. Prints the prompt tokens \
(messages + tools), the output tokens reserved (--max-tokens, else the request's max_tokens, \
else the default of 1024) and what an acquire reserves under the provider's preset: \
openai charges max(prompt, output), anthropic and generic prompt + output. No daemon is \
needed.\n\n\
Exit codes: 0 counted, 1 bad JSON, a prompt above the bounds, or a model openai cannot count."
    )]
    CountTokens {
        /// Model whose tokenizer counts (e.g. gpt-4o-mini, gpt-4, claude-sonnet-4-5).
        #[arg(long)]
        model: String,
        /// Provider preset: the tokenizer and the cost rule.
        #[arg(long, value_enum, default_value_t = ProviderArg::Generic)]
        provider: ProviderArg,
        /// Output tokens to reserve, instead of the request's max_tokens.
        #[arg(long, value_name = "N")]
        max_tokens: Option<u64>,
    },
    /// Send acquires as fast as answers come, and report throughput and latency.
    #[command(
        after_help = "Prints one JSON object: acquires, granted, denied, errors, \
acquires_per_second and latency percentiles in microseconds. Used by bench/ and the tests.\n\n\
Exit codes: 0 the run completed, 1 the daemon was unreachable."
    )]
    Loadgen(LoadgenArgs),
}

#[derive(clap::Args)]
struct LoadgenArgs {
    #[command(flatten)]
    socket: SocketArgs,
    /// The limit to draw from.
    limit: String,
    /// Tokens each acquire asks for.
    #[arg(long, default_value_t = 1)]
    tokens: u64,
    /// Connections to open.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Acquires kept in flight on each connection.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// max_wait_ms of each acquire.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    max_wait: u64,
    /// Release each granted lease right away (one more round trip).
    #[arg(long)]
    release: bool,
    /// Write one line per grant: arrival time (ms since the Unix epoch) and tokens.
    #[arg(long, value_name = "FILE")]
    grant_log: Option<PathBuf>,
}

#[derive(clap::Args)]
struct SocketArgs {
    /// Path of the daemon's Unix socket.
    #[arg(long, short, env = config::ENV_SOCKET, default_value = "/tmp/ratekeeper.sock")]
    socket: PathBuf,
}

#[derive(clap::Args)]
struct LoggingArgs {
    /// Log format on stderr.
    #[arg(long, env = "RATEKEEPER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Log filter, e.g. `info` or `ratekeeper=debug` (overridden by RUST_LOG).
    #[arg(long, default_value = "info")]
    log_level: String,
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
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(runtime_error) => {
            eprintln!("ratekeeper: cannot start the async runtime: {runtime_error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("ratekeeper: {failure:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve { config, logging } => serve(config.as_deref(), &logging).await,
        Command::CheckConfig { file } => {
            let config = load_config(Some(&file))?;
            print!("{}", config.to_effective_toml());
            eprintln!("{}: valid", file.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { socket, limit } => status(&socket.socket, limit).await,
        Command::CountTokens {
            model,
            provider,
            max_tokens,
        } => count_tokens(&model, provider.into(), max_tokens),
        Command::Ping { socket } => {
            let client = connect(&socket.socket).await?;
            let started = std::time::Instant::now();
            match client.call(Request::Ping).await? {
                Response::Pong => {
                    println!(
                        "pong from {} in {:?}",
                        socket.socket.display(),
                        started.elapsed()
                    );
                    Ok(ExitCode::SUCCESS)
                }
                other => bail!("unexpected answer to Ping: {other:?}"),
            }
        }
        Command::Loadgen(args) => {
            let report = ratekeeper::loadgen::run(ratekeeper::loadgen::LoadOptions {
                socket: args.socket.socket,
                limit: args.limit,
                tokens: args.tokens,
                connections: args.connections.max(1),
                concurrency: args.concurrency.max(1),
                duration: Duration::try_from_secs_f64(args.seconds)
                    .context("--seconds must be a finite number of seconds, not negative")?,
                max_wait_ms: args.max_wait,
                release: args.release,
                grant_log: args.grant_log,
            })
            .await?;
            println!("{}", serde_json::to_string(&report)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Acquire {
            socket,
            limit,
            tokens,
            max_wait,
            tenant,
            priority,
            report,
            release,
        } => {
            let request = Acquire {
                limit,
                tenant,
                priority,
                cost: Cost::Tokens {
                    input_tokens: tokens,
                    output_tokens: 0,
                },
                max_wait_ms: max_wait,
            };
            acquire(&socket.socket, request, report, release).await
        }
    }
}

fn load_config(path: Option<&Path>) -> anyhow::Result<Config> {
    config::load(path, |name| std::env::var(name).ok()).context("invalid configuration")
}

async fn serve(config_path: Option<&Path>, logging: &LoggingArgs) -> anyhow::Result<ExitCode> {
    let config = load_config(config_path)?;
    init_logging(logging)?;
    preload_tokenizers(&config)?;
    let store: Arc<dyn Store> = match &config.redis {
        Some(redis) => {
            let shared = RedisStore::new(redis).context("cannot set up the Redis store")?;
            tracing::info!(
                nodes = %redis.masked_nodes(),
                cluster = redis.url.is_none(),
                pool_size = redis.pool_size,
                timeout_ms = redis.timeout_ms,
                on_failure = ?redis.on_failure,
                "buckets are shared through Redis"
            );
            // Denials this sidecar can prove from Redis's last answer are
            // repeated locally instead of costing a script call; the failure
            // policy wraps both, so only Redis's own answers teach it.
            Arc::new(FallbackStore::new(
                Box::new(FailFastStore::new(Box::new(shared))),
                redis.on_failure,
                redis.local_share.unwrap_or(1.0),
            ))
        }
        None => {
            tracing::warn!(
                "no [redis] configured: using the embedded store, so limits hold for this \
                 process only; configure redis.url to share them across sidecars"
            );
            Arc::new(EmbeddedStore::new())
        }
    };
    let settings = ServerSettings {
        socket_path: config.server.socket.clone(),
        allowed_uids: config.server.allowed_uids.clone(),
        allowed_gids: config.server.allowed_gids.clone(),
        drain_timeout: Duration::from_millis(config.server.drain_timeout_ms),
    };
    let (socket, socket_mode, limits) = (
        config.server.socket.clone(),
        config.server.socket_mode,
        config.limits.len(),
    );
    let store_kind = store.kind();
    let dispatcher = Arc::new(Dispatcher::new(Arc::new(config), store));
    // Signal handlers go in before the socket exists: a client that sees the
    // socket may signal the daemon at once.
    let shutdown = shutdown_signal()?;
    let reloads = reload_on_sighup(config_path.map(Path::to_path_buf), dispatcher.clone())?;
    let listener = server::bind(&socket, socket_mode)?;
    tracing::info!(
        socket = %socket.display(),
        store = store_kind,
        limits,
        version = env!("CARGO_PKG_VERSION"),
        "listening"
    );
    server::run(listener, dispatcher, settings, shutdown).await;
    reloads.abort();
    Ok(ExitCode::SUCCESS)
}

/// Builds the tiktoken encoders the limits count with, so that no request
/// pays for it (about 0.2 s and 45 MiB for o200k_base, 0.1 s and 24 MiB
/// for cl100k_base); encoders already built are kept.
fn preload_tokenizers(config: &Config) -> anyhow::Result<()> {
    let built = tokens::preload_encodings(config.encodings())
        .context("cannot build the tokenizers the limits count with")?;
    for preloaded in built.iter().filter(|p| !p.build_time.is_zero()) {
        tracing::info!(
            encoding = %preloaded.encoding,
            build_ms = preloaded.build_time.as_millis() as u64,
            "tokenizer ready"
        );
    }
    Ok(())
}

/// Completes on the first SIGTERM or SIGINT.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook_tokio::Signals::new([SIGTERM, SIGINT])
        .context("cannot install signal handlers")?;
    Ok(async move {
        if let Some(signal) = signals.next().await {
            tracing::info!(signal, "shutdown requested");
        }
    })
}

/// On every SIGHUP, loads and validates the config again and hands it to
/// the dispatcher; a config that fails is reported and the old one stays.
fn reload_on_sighup(
    config_path: Option<PathBuf>,
    dispatcher: Arc<Dispatcher>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut signals = signal_hook_tokio::Signals::new([signal_hook::consts::SIGHUP])
        .context("cannot install the SIGHUP handler")?;
    Ok(tokio::spawn(async move {
        while signals.next().await.is_some() {
            let outcome = match load_config(config_path.as_deref()) {
                // Build the encoders of new models before the limits use them.
                Ok(config) => tokio::task::spawn_blocking(move || {
                    preload_tokenizers(&config).map(|()| config)
                })
                .await
                .context("building the tokenizers failed")
                .and_then(|built| built)
                .and_then(|config| Ok(dispatcher.reload(config)?)),
                Err(failure) => Err(failure),
            };
            match outcome {
                Ok(()) => tracing::info!(
                    limits = dispatcher.config().limits.len(),
                    "configuration reloaded"
                ),
                Err(failure) => tracing::error!(
                    "configuration not reloaded, the previous one stays in force: {failure:#}"
                ),
            }
        }
    }))
}

fn init_logging(logging: &LoggingArgs) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&logging.log_level))
        .context("invalid --log-level")?;
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match logging.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    Ok(())
}

async fn connect(socket: &Path) -> anyhow::Result<Client> {
    let name = format!("ratekeeper-cli pid={}", std::process::id());
    Ok(Client::connect(socket, &name).await?)
}

async fn status(socket: &Path, limit: Option<String>) -> anyhow::Result<ExitCode> {
    let client = connect(socket).await?;
    match client.call(Request::Status { limit }).await? {
        Response::Status { store, limits } => {
            println!("store: {store}");
            println!(
                "{:<24} {:<14} {:>14} {:>14} {:>14} {:>8}",
                "LIMIT", "BUCKET", "LEVEL", "CAPACITY", "PER MINUTE", "WAITERS"
            );
            for limit in limits {
                for bucket in &limit.buckets {
                    println!(
                        "{:<24} {:<14} {:>14} {:>14} {:>14} {:>8}",
                        limit.name,
                        bucket.name,
                        bucket.level,
                        bucket.capacity,
                        bucket.per_minute,
                        limit.waiters
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        other => answer_failure(other),
    }
}

async fn acquire(
    socket: &Path,
    request: Acquire,
    report: Option<u64>,
    release: bool,
) -> anyhow::Result<ExitCode> {
    let client = connect(socket).await?;
    match client.call(Request::Acquire(request)).await? {
        Response::Granted {
            lease,
            tokens,
            waited_ms,
        } => {
            println!("granted lease={lease} tokens={tokens} waited_ms={waited_ms}");
            let settle = match report {
                Some(used) => Some(Request::Report {
                    lease,
                    input_tokens: used,
                    output_tokens: 0,
                }),
                None if release => Some(Request::Release { lease }),
                None => None,
            };
            if let Some(settle) = settle {
                match client.call(settle).await? {
                    Response::Settled { tokens_returned } => {
                        println!("settled lease={lease} tokens_returned={tokens_returned}")
                    }
                    Response::Released { tokens_returned } => {
                        println!("released lease={lease} tokens_returned={tokens_returned}")
                    }
                    other => return answer_failure(other),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Response::Denied {
            retry_after_ms,
            bucket,
        } => {
            println!("denied bucket={bucket} retry_after_ms={retry_after_ms}");
            Ok(ExitCode::from(EXIT_DENIED))
        }
        other => answer_failure(other),
    }
}

/// `count-tokens`: the prompt of the chat request on stdin, counted with
/// the preset's tokenizer for `model`, and the reservation an acquire makes.
fn count_tokens(
    model: &str,
    provider: Provider,
    max_tokens: Option<u64>,
) -> anyhow::Result<ExitCode> {
    use std::io::Read;
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("cannot read stdin")?;
    let request = tokens::openai::chat_request_from_json(&text)
        .context("cannot read the chat request on stdin")?;
    let Ok(tokenizer) = provider.auto_tokenizer(Some(model)) else {
        bail!(
            "model {model:?} has no known tiktoken encoding, so the openai preset cannot count it; \
             use an OpenAI model name, or --provider generic for the character estimate"
        );
    };
    let counter = tokenizer.counter(CharEstimator::default());
    let prompt = tokens::count_messages(counter, &request)?;
    let (output, output_source) = match (max_tokens, request.max_output_tokens) {
        (Some(given), _) => (given, "--max-tokens"),
        (None, Some(given)) => (given, "max_tokens"),
        (None, None) => (config::DEFAULT_MAX_OUTPUT_TOKENS, "default"),
    };
    let rule = provider.cost_rule();
    let reserved = rule
        .charge(prompt.total, output)
        .context("the reservation overflows 64 bits")?;
    let counted_with = match tokenizer.encoding() {
        Some(encoding) => format!("{encoding} (tiktoken)"),
        None => format!(
            "the character estimate ({} chars per token x {})",
            CharEstimator::DEFAULT_CHARS_PER_TOKEN,
            CharEstimator::DEFAULT_SAFETY_FACTOR
        ),
    };
    let rule_text = match rule {
        config::CostRule::Sum => "prompt + output",
        config::CostRule::Max => "max(prompt, output)",
    };
    let provider_name = match provider {
        Provider::Openai => "openai",
        Provider::Anthropic => "anthropic",
        Provider::Generic => "generic",
    };
    println!("counter: {counted_with}");
    println!(
        "prompt_tokens: {} (messages {}, tools {})",
        prompt.total, prompt.messages, prompt.tools
    );
    println!("output_tokens: {output} ({output_source})");
    println!("reserved: {reserved} ({provider_name}: {rule_text})");
    Ok(ExitCode::SUCCESS)
}

fn answer_failure(response: Response) -> anyhow::Result<ExitCode> {
    match response {
        Response::Error { code, message } => {
            let name = ErrorCode::from_u16(code)
                .map(|code| format!("{code:?}"))
                .unwrap_or_else(|| "unknown".to_string());
            bail!("error {code} ({name}): {message}")
        }
        other => bail!("unexpected answer: {other:?}"),
    }
}
