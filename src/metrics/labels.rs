//! Label values from the configuration, so that a client's names never
//! grow the number of series: a limit the config does not know is counted
//! as `(unknown)`, a tenant `[metrics] tenants` does not list as `other`.

use std::collections::HashSet;

use crate::config::{Config, MetricsConfig};

use super::Name;

/// The `limit` label of a limit the configuration does not name.
pub const UNKNOWN_LIMIT: &str = "(unknown)";

/// The label values one configuration allows.
#[derive(Debug)]
pub struct Labels {
    limits: HashSet<Name>,
    tenants: HashSet<Name>,
    unknown_limit: Name,
    other_tenant: Name,
    no_tenant: Name,
}

impl Labels {
    /// The limits and the `[metrics] tenants` of `config`.
    pub fn new(config: &Config) -> Self {
        Labels {
            limits: config
                .limits
                .iter()
                .map(|l| Name::from(l.name.as_str()))
                .collect(),
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

    /// The `limit` label of `name`.
    pub fn limit(&self, name: &str) -> Name {
        self.limits.get(name).unwrap_or(&self.unknown_limit).clone()
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
        let labels = Labels::new(&config);
        assert_eq!(&*labels.limit("gpt"), "gpt");
        assert_eq!(&*labels.limit("gpt\nforged"), UNKNOWN_LIMIT);
        assert_eq!(&*labels.tenant(Some("acme")), "acme");
        assert_eq!(&*labels.tenant(Some("initech")), "other");
        assert_eq!(&*labels.tenant(None), "");
        assert!(labels.names_tenant("acme") && !labels.names_tenant("other"));
    }
}
