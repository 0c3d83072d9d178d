//! Label values from the configuration, so that a client's names never
//! grow the number of series: a limit the config does not know is counted
//! as `(unknown)`, a tenant `[metrics] tenants` does not list as `other`.
//! Each configured limit's own series are resolved once per configuration,
//! so that the hot path finds them with one lookup.

use std::collections::{HashMap, HashSet};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

use crate::config::{Config, MetricsConfig};

use super::registry::{LimitLabel, SettleLabels};
use super::{Metrics, Name};

/// One limit's series that carry no other label.
#[derive(Debug, Clone)]
pub struct LimitMeters {
    pub waits: Histogram,
    pub estimation_error: Histogram,
    pub refunded_tokens: Counter,
    pub reports_settled: Counter,
    pub releases_settled: Counter,
}

impl LimitMeters {
    fn new(metrics: &Metrics, limit: &Name) -> Self {
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
        }
    }
}

/// The `limit` label of a limit the configuration does not name.
pub const UNKNOWN_LIMIT: &str = "(unknown)";

/// The label values one configuration allows.
#[derive(Debug)]
pub struct Labels {
    limits: HashMap<Name, LimitMeters>,
    tenants: HashSet<Name>,
    unknown_limit: Name,
    other_tenant: Name,
    no_tenant: Name,
}

impl Labels {
    /// The limits and the `[metrics] tenants` of `config`, each limit's
    /// series in `metrics`.
    pub fn new(config: &Config, metrics: &Metrics) -> Self {
        let limits = config.limits.iter().map(|limit| {
            let name = Name::from(limit.name.as_str());
            let meters = LimitMeters::new(metrics, &name);
            (name, meters)
        });
        Labels {
            limits: limits.collect(),
            tenants: config
                .metrics
                .tenants
                .iter()
                .map(|t| Name::from(t.as_str()))
                .collect(),
            unknown_limit: Name::from(UNKNOWN_LIMIT),
            other_tenant: Name::from(MetricsConfig::OTHER_TENANTS),
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
    pub fn tenant(&self, tenant: Option<&str>) -> Name {
        match tenant {
            None => self.no_tenant.clone(),
            Some(name) => self.tenants.get(name).unwrap_or(&self.other_tenant).clone(),
        }
    }

    /// Whether `tenant` has a label of its own.
    pub fn names_tenant(&self, tenant: &str) -> bool {
        self.tenants.contains(tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_configured_names_become_labels() {
        let mut config = Config::default();
        config.limits = crate::config::from_toml_str(
            "[[limits]]\nname = \"gpt\"\ntokens_per_minute = 10\n",
            "t",
        )
        .unwrap()
        .limits;
        config.metrics.tenants = vec!["acme".into()];
        let labels = Labels::new(&config, &Metrics::new());
        assert_eq!(&*labels.limit("gpt").0, "gpt");
        assert!(labels.limit("gpt").1.is_some());
        assert_eq!(&*labels.limit("gpt\nforged").0, UNKNOWN_LIMIT);
        assert!(labels.limit("gpt\nforged").1.is_none());
        assert_eq!(&*labels.tenant(Some("acme")), "acme");
        assert_eq!(&*labels.tenant(Some("initech")), "other");
        assert_eq!(&*labels.tenant(None), "");
        assert!(labels.names_tenant("acme") && !labels.names_tenant("other"));
    }
}
