//! What the daemon counts as it happens: the Prometheus registry
//! ([`Metrics`]), the label sets one configuration allows ([`Labels`]) and
//! the counters a store records its calls into ([`StoreCalls`]). A leaf:
//! it imports nothing of the crate, so that every room may count. What is
//! read at scrape time, the `/metrics` listener and the shutdown summary
//! live above the service, in `crate::exporter`.
//!
//! Every metric is named `ratekeeper_…`; docs/metrics.md lists them all.

mod labels;
pub mod registry;

pub use labels::{Labels, LimitMeters, OTHER_TENANTS, TenantLabel};
pub use registry::{Metrics, Name, OpenGuard, StoreCalls, TenantLabels};
