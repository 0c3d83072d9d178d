//! ratekeeper: one shared, exact rate limit for every worker that calls an LLM API.
//!
//! # The rooms
//!
//! | module | owns |
//! | --- | --- |
//! | [`app`] | assembly: config → store stack, tokenizers, service, socket, reloads |
//! | [`config`] | the typed configuration: loading, validation, rendering |
//! | [`proto`] | the wire protocol: frame bounds, messages, the framing codec; no I/O |
//! | [`server`] | the Unix socket: bind, peer credentials, connection bounds, one task per connection driving its requests, drain |
//! | [`service`] | the request handlers: acquire, report, release, estimate, status, health, inspect, provider feedback; their typed error and wire codes |
//! | [`plan`] | pure planning: limits → buckets, cost rules, priority floors, capacity |
//! | [`leases`] | granted reservations awaiting their report, and settlement arithmetic |
//! | [`limiter`] | the store interface (one `Op` enum, `Store::call`, `Lifecycle`) and the key schema: Redis (the only module touching redis types), embedded, fail-fast, failure policy; the stack one daemon answers from; store health and its watcher |
//! | [`feedback`] | what a provider's rate-limit headers say: a pause after a 429, what remains |
//! | [`budget`] | what spend budgets are made of: the calendar periods a budget resets on, in a time zone; money in micro-units with the price of a call; the shipped price table; budgets as the config declares them (docs/budgets.md) |
//! | [`tokens`] | token counting: tiktoken encoders, character estimates, the providers' image and tool-prompt rules, provider presets |
//! | [`metrics`] | the Prometheus registry, the label sets a configuration allows, the counters a store records into (a leaf) |
//! | [`exporter`] | the `/metrics` `/healthz` `/readyz` listener, what is read at scrape time, the shutdown summary |
//! | [`systemd`] | the `Type=notify` readiness datagram |
//! | [`logging`] | logs on stderr that a closed stderr cannot turn into a failure |
//! | [`client`] | a small async client of the socket, for the CLI, `ratekeeper-loadgen` and tests |
//!
//! # One acquire's path
//!
//! `server::connection` reads a frame and decodes it (`proto`), answers
//! `Hello`/`Ping`/`Cancel` itself and hands the rest to
//! [`service::Service::handle`] as a [`service::Call`]. The service counts
//! the prompt if the cost is messages (`tokens`), asks the [`plan::Planner`]
//! for one draw per bucket, reserves them all in one store call (`limiter`:
//! one Lua script on Redis), sleeps the wait the store returned, records a
//! lease (`leases`) and answers `Granted`. A later `Report` settles the
//! lease: unused tokens go back to the buckets. `Service::handle` observes
//! every call on its way: metrics, and a DEBUG decision line.

pub mod app;
pub mod budget;
pub mod client;
pub mod config;
pub mod exporter;
pub mod feedback;
pub mod leases;
pub mod limiter;
pub mod logging;
pub mod metrics;
pub mod plan;
pub mod proto;
#[cfg(test)]
mod rooms;
pub mod server;
pub mod service;
pub mod systemd;
pub mod tokens;
