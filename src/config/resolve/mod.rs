//! Resolution: the file as written ([`RawFile`]) checked section by section
//! into the typed [`Config`], every default filled in and every problem
//! reported at its place. One module a section; a section that refers to
//! another (a limit's group, a class's limits) is resolved after it.

mod budgets;
mod clients;
mod groups;
mod leases;
mod limits;
mod metrics;
mod priorities;
mod redis;
mod server;

pub(super) use metrics::parse_listen;
pub(super) use redis::redis_url_problem;
pub(super) use server::socket_problem;

use super::diagnostics::Diagnostics;
use super::model::Config;
use super::raw::RawFile;

/// The configuration `raw` describes; what cannot be used is reported to `d`
/// and left at its default.
pub(super) fn resolve(raw: RawFile, d: &mut Diagnostics) -> Config {
    let mut config = Config::default();
    if let Some(server) = raw.server {
        server::resolve_server(server, &mut config.server, d);
    }
    if let Some(redis) = &raw.redis {
        config.redis = redis::resolve_redis(redis, d);
    }
    config.groups = groups::resolve_groups(&raw.groups, d);
    if let Some(leases) = &raw.leases {
        config.leases = leases::resolve_leases(leases.get_ref(), d);
    }
    if let Some(metrics) = &raw.metrics {
        config.metrics = metrics::resolve_metrics(metrics.get_ref(), d);
    }
    let (resolved_limits, limit_names) =
        limits::resolve_limits(&raw.limits, &raw.groups, &config.groups, d);
    config.limits = resolved_limits;
    let (classes, class_names) =
        priorities::resolve_priorities(&raw.priorities, &raw.limits, &limit_names, d);
    if !classes.is_empty() {
        config.priorities = classes;
    }
    match &raw.default_priority {
        Some(default) => {
            let declared = (!raw.priorities.is_empty()).then_some(&class_names);
            if priorities::check_default_priority(default, declared, d) {
                config.default_priority = default.get_ref().clone();
            }
        }
        None => config.default_priority = config.priorities[0].name.clone(),
    }
    let declared = (!raw.priorities.is_empty()).then_some(&class_names);
    config.clients = clients::resolve_clients(&raw.clients, declared, d);
    if let Some(budgets) = &raw.budgets {
        config.budget_time_zone = budgets::resolve_time_zone(budgets.get_ref(), d);
    }
    budgets::price_budgeted_limits(&mut config, &raw.limits, d);
    config
}
