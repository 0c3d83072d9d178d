//! ratekeeper: one shared, exact rate limit for every worker that calls an LLM API.

pub mod config;
pub mod limiter;
pub mod proto;
