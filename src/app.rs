//! The assembly room: from a validated configuration to a serving daemon —
//! the store stack, the tokenizers, the service, the socket, and the reload
//! policy. `main.rs` only parses the command line and turns signals into a
//! shutdown future and reload requests; tests can start a daemon in-process.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{self, Config, ConfigError, RedisConfig};
use crate::exporter::{self, Exporter};
use crate::limiter::health::{self, StoreHealth};
use crate::limiter::redis::{PrimaryAuth, RedisNodes, RedisSettings, RedisSetupError};
use crate::limiter::{RedisStore, Stores};
use crate::metrics::Metrics;
use crate::server::{self, BindError, ServerSettings};
use crate::service::{ReloadError, Service};
use crate::systemd;
use crate::tokens::{self, TokenError};

/// Why the daemon could not start, or a reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("cannot set up the Redis store: {0}")]
    Redis(#[from] RedisSetupError),
    #[error("cannot build the tokenizers the limits count with: {0}")]
    Tokenizers(#[from] TokenError),
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(transparent)]
    Reload(#[from] ReloadError),
    #[error("building the tokenizers failed: {0}")]
    TokenizerTask(String),
    #[error(
        "cannot listen for metrics on {address}: {source} (metrics.listen, or \
         RATEKEEPER_METRICS_LISTEN: each sidecar on a host needs a port of its own)"
    )]
    MetricsBind {
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// A daemon assembled from its configuration, ready to bind and serve.
pub struct App {
    service: Arc<Service>,
    stores: Stores,
    metrics: Arc<Metrics>,
    /// Set once the socket listens: part of readiness.
    socket_bound: Arc<AtomicBool>,
    /// The `[metrics] listen` listener, once bound.
    metrics_listener: Option<tokio::net::TcpListener>,
    /// Read again on every reload; `None` serves the built-in defaults.
    config_path: Option<PathBuf>,
    /// Retries a warm-up that failed at start, until it succeeds.
    warming: Option<tokio::task::JoinHandle<()>>,
}

/// What the Redis store needs from `[redis]`.
pub fn redis_settings(redis: &RedisConfig) -> RedisSettings {
    RedisSettings {
        nodes: match (&redis.url, &redis.master) {
            (Some(url), _) => RedisNodes::Single(url.clone()),
            (None, Some(master)) => RedisNodes::Sentinel {
                sentinels: redis.sentinels.clone(),
                master: master.name.clone(),
                auth: PrimaryAuth {
                    username: master.username.clone(),
                    password: master.password.clone(),
                    db: master.db as i64,
                },
            },
            (None, None) => RedisNodes::Cluster(redis.cluster_nodes.clone()),
        },
        display: redis.masked_nodes(),
        tls_ca_file: redis.tls_ca_file.clone(),
        pool_size: redis.pool_size as usize,
        timeout: Duration::from_millis(redis.timeout_ms),
        connect_timeout: Duration::from_millis(redis.connect_timeout_ms),
    }
}

/// Builds the store stack `config` asks for: the embedded store, or Redis
/// under local fail-fast under the failure policy; the store itself timed
/// and counted into `metrics`.
pub fn build_stores(config: &Config, metrics: &Metrics) -> Result<Stores, AppError> {
    let calls = metrics.store.clone();
    let Some(redis) = &config.redis else {
        tracing::warn!(
            "no [redis] configured: using the embedded store, so limits hold for this \
             process only; configure redis.url to share them across sidecars"
        );
        return Ok(Stores::embedded(calls));
    };
    let timeout = Duration::from_millis(redis.timeout_ms);
    let shared = Arc::new(RedisStore::new(&redis_settings(redis))?);
    tracing::info!(
        nodes = %redis.masked_nodes(),
        topology = redis.topology(),
        pool_size = redis.pool_size,
        timeout_ms = redis.timeout_ms,
        on_failure = redis.on_failure.name(),
        "buckets are shared through Redis"
    );
    Ok(Stores::over_redis(
        shared,
        calls,
        timeout,
        redis.on_failure,
        redis.local_share.unwrap_or(1.0),
    ))
}

/// The runtime `serve` runs on, before it is built (the in-process test
/// harness adds its own thread hooks). One thread runs everything unless
/// more are asked for: a request then never crosses threads on its way from
/// the socket to Redis and back, which saves the futex wake-ups that cost
/// the most CPU per acquire (bench/PROFILE.md). Token counting has its
/// blocking threads either way.
pub fn runtime_builder(threads: usize) -> tokio::runtime::Builder {
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    };
    builder.enable_all();
    builder
}

/// Builds the tiktoken encoders the limits count with, so that no request
/// pays for it (about 0.2 s and 45 MiB for o200k_base, 0.1 s and 24 MiB
/// for cl100k_base); encoders already built are kept.
pub fn preload_tokenizers(config: &Config) -> Result<(), AppError> {
    let built = tokens::preload_encodings(config.encodings())?;
    for preloaded in built.iter().filter(|p| !p.build_time.is_zero()) {
        tracing::info!(
            encoding = %preloaded.encoding,
            build_ms = preloaded.build_time.as_millis() as u64,
            "tokenizer ready"
        );
    }
    Ok(())
}

/// Logs the advice `check-config` prints about a valid config.
fn log_warnings(config: &Config) {
    for warning in config.warnings() {
        tracing::warn!("config: {warning}");
    }
}

/// Loads the config file (or the defaults) with the process environment's
/// overrides, validated exactly as `check-config` does.
pub fn load_config(path: Option<&Path>) -> Result<Config, ConfigError> {
    config::load(path, |name| std::env::var(name).ok())
}

impl App {
    /// Assembles a daemon for `config`, which was loaded from `config_path`.
    pub fn new(config: Config, config_path: Option<PathBuf>) -> Result<App, AppError> {
        log_warnings(&config);
        preload_tokenizers(&config)?;
        let metrics = Arc::new(Metrics::new());
        let stores = build_stores(&config, &metrics)?;
        let store_health = StoreHealth::new(stores.store.as_ref(), stores.fallback.clone())
            .with_shapes(stores.redis.as_ref().map(|redis| redis.shape_conflicts()));
        let service = Arc::new(Service::new(
            Arc::new(config),
            stores.store.clone(),
            store_health,
            metrics.clone(),
        ));
        Ok(App {
            service,
            stores,
            metrics,
            socket_bound: Arc::default(),
            metrics_listener: None,
            config_path,
            warming: None,
        })
    }

    /// Connects to Redis, authenticates and loads the scripts before the
    /// socket appears, so that the first acquire pays for none of it and
    /// the buckets' clock starts with the daemon. When that fails the
    /// daemon still starts (the failure policy serves), says so with the
    /// nodes and the policy, and keeps trying in the background.
    pub async fn warm_up(&mut self) {
        let config = self.service.config();
        let Some(redis) = config.redis.as_ref() else {
            return;
        };
        let nodes = redis.masked_nodes();
        match self.stores.store.warm_up().await {
            Ok(()) => tracing::info!(%nodes, "connected to Redis and loaded the scripts"),
            Err(cause) => {
                tracing::warn!(
                    %nodes,
                    on_failure = redis.on_failure.name(),
                    %cause,
                    "Redis is not reachable at start; the failure policy answers until it is, \
                     and the daemon keeps trying in the background"
                );
                let store = self.stores.store.clone();
                self.warming = Some(tokio::spawn(async move {
                    let mut pause = Duration::from_millis(100);
                    loop {
                        tokio::time::sleep(pause).await;
                        if store.warm_up().await.is_ok() {
                            tracing::info!(%nodes, "connected to Redis and loaded the scripts");
                            return;
                        }
                        pause = (pause * 2).min(Duration::from_secs(5));
                    }
                }));
            }
        }
    }

    /// The service answering this daemon's calls.
    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }

    /// Binds the configured socket with its file mode, and the metrics
    /// listener when `[metrics] listen` asks for one.
    pub fn bind(&mut self) -> Result<UnixListener, AppError> {
        let config = self.service.config();
        if let Some(address) = config.metrics.listen {
            let bound = std::net::TcpListener::bind(address)
                .and_then(|listener| {
                    listener.set_nonblocking(true)?;
                    tokio::net::TcpListener::from_std(listener)
                })
                .map_err(|source| AppError::MetricsBind { address, source })?;
            self.metrics_listener = Some(bound);
        }
        Ok(server::bind(
            &config.server.socket,
            config.server.socket_mode,
            config.server.allow_world_writable_dir,
        )?)
    }

    /// Where the metrics listener listens, once bound (port 0 resolved).
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
    }

    /// Loads the config file again and applies it; on any failure the
    /// running configuration stays. Returns how many limits are in force.
    pub async fn reload(&self) -> Result<usize, AppError> {
        reload(&self.service, self.config_path.as_deref()).await
    }

    /// Serves `listener` until `shutdown` completes, reloading the config on
    /// every message of `reloads`, then drains and logs what it counted.
    pub async fn serve(
        mut self,
        listener: UnixListener,
        shutdown: impl Future<Output = ()>,
        mut reloads: mpsc::UnboundedReceiver<()>,
    ) {
        let config = self.service.config();
        self.socket_bound.store(true, Ordering::SeqCst);
        let watch = self.stores.fallback.as_ref().map(|_| {
            let calls = self.metrics.store.clone();
            tokio::spawn(health::watch_store(self.stores.store.clone(), calls))
        });
        let stop_exporter = CancellationToken::new();
        if let Some(listener) = self.metrics_listener.take() {
            let address = listener
                .local_addr()
                .map_or_else(|_| String::new(), |a| a.to_string());
            let address = address.as_str();
            tracing::info!(address, "serving /metrics, /healthz and /readyz");
            let exporter = Arc::new(Exporter::new(
                self.service.clone(),
                self.stores.clone(),
                self.socket_bound.clone(),
            ));
            tokio::spawn(exporter::serve(listener, exporter, stop_exporter.clone()));
        }
        let settings = ServerSettings {
            socket_path: config.server.socket.clone(),
            allowed_uids: config.server.allowed_uids.clone(),
            allowed_gids: config.server.allowed_gids.clone(),
            drain_timeout: Duration::from_millis(config.server.drain_timeout_ms),
            bounds: server::Bounds {
                max_connections: usize::try_from(config.server.max_connections)
                    .unwrap_or(usize::MAX),
                max_connections_per_uid: config
                    .server
                    .max_connections_per_uid
                    .map(|cap| usize::try_from(cap).unwrap_or(usize::MAX)),
                max_buffered_bytes: usize::try_from(config.server.max_buffered_bytes)
                    .unwrap_or(usize::MAX),
                hello_timeout: Duration::from_millis(config.server.hello_timeout_ms),
                frame_timeout: Duration::from_millis(config.server.frame_timeout_ms),
            },
        };
        tracing::info!(
            socket = %config.server.socket.display(),
            store = self.stores.store.kind(),
            limits = config.limits.len(),
            version = env!("CARGO_PKG_VERSION"),
            "listening"
        );
        let reloader = {
            let (service, path) = (self.service.clone(), self.config_path.clone());
            tokio::spawn(async move {
                while reloads.recv().await.is_some() {
                    let outcome = reload(&service, path.as_deref()).await;
                    service.metrics().reloaded(outcome.is_ok());
                    match outcome {
                        Ok(limits) => tracing::info!(limits, "configuration reloaded"),
                        Err(failure) => tracing::error!(
                            "configuration not reloaded, the previous one stays in force: {failure}"
                        ),
                    }
                }
            })
        };
        if let Err(notify_error) = systemd::notify_ready() {
            tracing::warn!(%notify_error, "could not tell systemd the daemon is ready");
        }
        let shutdown = async {
            shutdown.await;
            let _ = systemd::notify_stopping();
        };
        server::run(listener, self.service.clone(), settings, shutdown).await;
        stop_exporter.cancel();
        if let Some(watch) = watch {
            watch.abort();
        }
        reloader.abort();
        if let Some(warming) = &self.warming {
            warming.abort();
        }
        exporter::log_shutdown_summary(&self.service, &self.stores);
    }
}

/// Loads the config at `path` again, builds the encoders of new models
/// before their limits apply, and hands it to `service`.
async fn reload(service: &Service, path: Option<&Path>) -> Result<usize, AppError> {
    let config = load_config(path)?;
    log_warnings(&config);
    let config = tokio::task::spawn_blocking(move || preload_tokenizers(&config).map(|()| config))
        .await
        .map_err(|failed| AppError::TokenizerTask(failed.to_string()))??;
    let limits = config.limits.len();
    service.reload(config)?;
    Ok(limits)
}
