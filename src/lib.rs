//! ratekeeper: one shared, exact rate limit for every worker that calls an LLM API.

pub mod client;
pub mod config;
pub mod dispatch;
pub mod leases;
pub mod limiter;
pub mod loadgen;
pub mod proto;
pub mod server;
pub mod tokens;
