//! Label values from the configuration, so that a client's names never
//! grow the number of series: a limit the config does not know is counted
//! as `(unknown)`, a tenant `[metrics] tenants` does not list as `other`.
//! Each configured limit's own series are resolved once per configuration,
//! so that the hot path finds them with one lookup.

use std::collections::HashMap;
use std::sync::OnceLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use super::registry::{AcquireLabels, LimitLabel, SettleLabels, TenantLabels};
use super::{Metrics, Name};

/// One limit's series that carry no other label.
#[derive(Debug, Clone)]
pub struct LimitMeters {
    pub waits: Histogram,
    pub estimation_error: Histogram,
    pub refunded_tokens: Counter,
    pub reports_settled: Counter,
    pub releases_settled: Counter,
    /// Per tenant label (by [`TenantLabel::index`]): the granted acquires
    /// and the tokens they took, created on the first grant.
    granted: Vec<OnceLock<(Counter, Counter)>>,
}

/// A `tenant` label, and its place among the configuration's.
#[derive(Debug, Clone)]
pub struct TenantLabel {
    pub name: Name,
    index: usize,
}

impl LimitMeters {
    fn new(metrics: &Metrics, limit: &Name, tenant_labels: usize) -> Self {
        let label = LimitLabel {
            limit: limit.clone(),
        };
        let settled = SettleLabels {
            limit: limit.clone(),
            outcome: "settled",
        };
        LimitMeters {
            waits: metrics.waits.get_or_create_owned(&label),
            estimation_error: metrics.estimation_error.get_or_create_owned(&label),
            refunded_tokens: metrics.refunded_tokens.get_or_create_owned(&label),
            reports_settled: metrics.reports.get_or_create_owned(&settled),
            releases_settled: metrics.releases.get_or_create_owned(&settled),
            granted: (0..tenant_labels).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The counters of `limit`'s grants to `tenant`: acquires, and tokens.
    pub fn granted(
        &self,
        metrics: &Metrics,
        limit: &Name,
        tenant: &TenantLabel,
    ) -> &(Counter, Counter) {
        self.granted[tenant.index].get_or_init(|| {
            let acquires = AcquireLabels {
                limit: limit.clone(),
                tenant: tenant.name.clone(),
                outcome: "granted",
                reason: "",
            };
            let tokens = TenantLabels {
                limit: limit.clone(),
                tenant: tenant.name.clone(),
            };
            (
                metrics.acquires.get_or_create_owned(&acquires),
                metrics.acquired_tokens.get_or_create_owned(&tokens),
            )
        })
    }
}

/// The `limit` label of a limit the configuration does not name.
pub const UNKNOWN_LIMIT: &str = "(unknown)";
/// The `tenant` label every tenant not listed shares (so `[metrics]
/// tenants` cannot list it).
pub const OTHER_TENANTS: &str = "other";

/// The label values one configuration allows.
#[derive(Debug)]
pub struct Labels {
    limits: HashMap<Name, LimitMeters>,
    /// Listed tenants, indexed from 2: 0 is no tenant, 1 `other`.
    tenants: HashMap<Name, usize>,
    unknown_limit: Name,
    other_tenant: Name,
    no_tenant: Name,
}

impl Labels {
    /// The configured `limits` (by name) and the listed `tenants` (`[metrics]
    /// tenants`), each limit's series in `metrics`.
    pub fn new<'a>(
        limits: impl IntoIterator<Item = &'a str>,
        tenants: &[String],
        metrics: &Metrics,
    ) -> Self {
        let limits = limits.into_iter().map(|limit| {
            let name = Name::from(limit);
            let meters = LimitMeters::new(metrics, &name, tenants.len() + 2);
            (name, meters)
        });
        Labels {
            limits: limits.collect(),
            tenants: (2..)
                .zip(tenants)
                .map(|(index, tenant)| (Name::from(tenant.as_str()), index))
                .collect(),
            unknown_limit: Name::from(UNKNOWN_LIMIT),
            other_tenant: Name::from(OTHER_TENANTS),
            no_tenant: Name::from(""),
        }
    }

    /// The `limit` label of `name`, and its series when configured.
    pub fn limit(&self, name: &str) -> (Name, Option<&LimitMeters>) {
        match self.limits.get_key_value(name) {
            Some((label, meters)) => (label.clone(), Some(meters)),
            None => (self.unknown_limit.clone(), None),
        }
    }

    /// The `tenant` label: the name when listed, `other` when not, empty
    /// without a tenant.
    pub fn tenant(&self, tenant: Option<&str>) -> TenantLabel {
        let (name, index) = match tenant.map(|name| self.tenants.get_key_value(name)) {
            None => (&self.no_tenant, 0),
            Some(None) => (&self.other_tenant, 1),
            Some(Some((name, index))) => (name, *index),
        };
        TenantLabel {
            name: name.clone(),
            index,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_configured_names_become_labels() {
        let labels = Labels::new(["gpt"], &["acme".to_string()], &Metrics::new());
        assert_eq!(&*labels.limit("gpt").0, "gpt");
        assert!(labels.limit("gpt").1.is_some());
        assert_eq!(&*labels.limit("gpt\nforged").0, UNKNOWN_LIMIT);
        assert!(labels.limit("gpt\nforged").1.is_none());
        assert_eq!(&*labels.tenant(Some("acme")).name, "acme");
        assert_eq!(&*labels.tenant(Some("initech")).name, "other");
        assert_eq!(&*labels.tenant(None).name, "");
    }
}
