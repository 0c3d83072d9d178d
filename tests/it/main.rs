//! The integration tests, one binary with a module per subject, so that the
//! crate and its dependencies are linked once (`tests/decode_memory.rs`
//! stays a binary of its own: it replaces the global allocator). Most start
//! a daemon in this process (`support::Daemon`, assembled through
//! `ratekeeper::app::App` as `main.rs` assembles it), talk to it over its
//! Unix socket, and start real `redis-server`s on free ports
//! (`support::redis`). Tests about the process itself (the CLI's exit
//! codes, signals, stderr and log levels, systemd's notify, RSS) start the
//! real binary (`support::SpawnedDaemon`); `in_process` drives `App` by
//! hand.
//!
//! `cargo test --test it daemon::` runs one module's tests.

mod support;

mod bad_input;
mod bounds;
mod budgets;
mod cli;
mod config_examples;
mod daemon;
mod deploy_examples;
mod fleet;
mod hardening;
mod in_process;
mod metrics;
mod outages;
mod redis_daemon;
mod redis_store;
mod request_shapes;
mod store_contract;
mod tokens;
mod tokens_daemon;
mod uid_policy;
mod vectors;
