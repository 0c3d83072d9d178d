//! The integration tests, one binary with a module per subject, so that the
//! crate and its dependencies are linked once (`tests/decode_memory.rs`
//! stays a binary of its own: it replaces the global allocator). Most start
//! the real daemon binary (`support::Daemon`) or an in-process one
//! (`in_process`), talk to it over its Unix socket, and start real
//! `redis-server`s on free ports (`support::redis`).
//!
//! `cargo test --test it daemon::` runs one module's tests.

mod support;

mod bad_input;
mod bounds;
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
