//! `[metrics]`: the HTTP listener for Prometheus and probes, and the tenants
//! whose series carry their own name.

use std::net::SocketAddr;

use crate::config::diagnostics::Diagnostics;
use crate::config::model::MetricsConfig;
use crate::config::raw::RawMetrics;
use crate::proto::MAX_NAME_LEN;

/// Context of every message about the section.
const CONTEXT: &str = "metrics";

/// The `[metrics]` section; bad values are reported and left at their defaults.
pub(super) fn resolve_metrics(raw: &RawMetrics, d: &mut Diagnostics) -> MetricsConfig {
    let mut resolved = MetricsConfig::default();
    if let Some(listen) = &raw.listen {
        match parse_listen(listen.get_ref()) {
            Ok(address) => resolved.listen = Some(address),
            Err(problem) => d.error(listen.span().start, format!("{CONTEXT}: {problem}")),
        }
    }
    let tenants = raw.tenants.as_deref().unwrap_or_default();
    if tenants.len() > MetricsConfig::MAX_TENANTS {
        d.error(
            tenants[MetricsConfig::MAX_TENANTS].span().start,
            format!(
                "{CONTEXT}: tenants lists {} names, more than the {} that keep the number of series bounded",
                tenants.len(),
                MetricsConfig::MAX_TENANTS
            ),
        );
    }
    for (index, tenant) in tenants.iter().enumerate() {
        let name = tenant.get_ref();
        let at = tenant.span().start;
        let problem = if name.is_empty() || name.len() > MAX_NAME_LEN {
            Some(format!("must be 1 to {MAX_NAME_LEN} bytes long"))
        } else if name == MetricsConfig::OTHER_TENANTS {
            Some(format!(
                "{name:?} is the label of every tenant not listed, so it cannot name one"
            ))
        } else if resolved.tenants.contains(name) {
            Some(format!("{name:?} is listed twice"))
        } else {
            None
        };
        match problem {
            Some(problem) => d.error(at, format!("{CONTEXT}: tenants[{index}] {problem}")),
            None => resolved.tenants.push(name.clone()),
        }
    }
    resolved
}

/// The address `listen` names, or what is wrong with it: it must be an IP
/// address and a port (no host names: the listener binds before any
/// resolver is asked).
pub(in crate::config) fn parse_listen(listen: &str) -> Result<SocketAddr, String> {
    listen.parse().map_err(|_| {
        format!(
            "listen {listen:?} is not an IP address and port, e.g. \"127.0.0.1:9464\" or \"[::]:9464\""
        )
    })
}
