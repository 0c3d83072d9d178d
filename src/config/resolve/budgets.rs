//! `[budgets]`, the budget tables of limits and groups, and a limit's
//! `price` (docs/budgets.md).

use std::collections::BTreeMap;

use toml::Spanned;

use crate::budget::money::{Price, format_amount, parse_amount};
use crate::budget::period::zone;
use crate::budget::prices::PriceTable;
use crate::budget::spans::{Budget, Span};
use crate::config::diagnostics::Diagnostics;
use crate::config::model::{
    Budgets, Config, DEFAULT_BUDGET_TIME_ZONE, MAX_BUDGET, MAX_ROLLING_BUDGET,
};
use crate::config::raw::{RawBudget, RawBudgets, RawLimit, RawPrice};

/// `[budgets] time_zone`, checked against the time zone database.
pub(super) fn resolve_time_zone(raw: &RawBudgets, d: &mut Diagnostics) -> String {
    let Some(written) = &raw.time_zone else {
        return DEFAULT_BUDGET_TIME_ZONE.to_string();
    };
    match zone(written.get_ref()) {
        Ok(_) => written.get_ref().clone(),
        Err(problem) => {
            d.error(
                written.span().start,
                format!("[budgets]: time_zone: {problem}"),
            );
            DEFAULT_BUDGET_TIME_ZONE.to_string()
        }
    }
}

/// A limit's or group's `budget`, `tenant_budget` and `tenant_budgets`, or
/// `None` when one of them is wrong.
pub(super) fn resolve_budgets(
    budget: &Option<Spanned<RawBudget>>,
    tenant_budget: &Option<Spanned<RawBudget>>,
    tenant_budgets: &Option<Spanned<BTreeMap<String, Spanned<RawBudget>>>>,
    context: &str,
    d: &mut Diagnostics,
) -> Option<Budgets> {
    // Every table is checked, so that one pass reports every problem.
    let mut valid = true;
    let mut check = |raw: &Spanned<RawBudget>, field: &str, d: &mut Diagnostics| {
        let resolved = resolve_budget(raw, context, field, d);
        valid &= resolved.is_some();
        resolved
    };
    let budget = budget.as_ref().and_then(|raw| check(raw, "budget", d));
    let tenant_budget = tenant_budget
        .as_ref()
        .and_then(|raw| check(raw, "tenant_budget", d));
    let mut named = BTreeMap::new();
    for (tenant, raw) in tenant_budgets.iter().flat_map(|map| map.get_ref()) {
        let field = format!("tenant_budgets.{tenant}");
        if let Some(resolved) = check(raw, &field, d) {
            named.insert(tenant.clone(), resolved);
        }
    }
    valid.then_some(Budgets {
        budget,
        tenant_budget,
        tenant_budgets: named,
    })
}

/// One budget table: at least one amount, each a positive amount of money
/// within the span's bound.
fn resolve_budget(
    raw: &Spanned<RawBudget>,
    context: &str,
    field: &str,
    d: &mut Diagnostics,
) -> Option<Budget> {
    let mut amounts = Vec::new();
    let mut valid = true;
    for (span, written) in raw.get_ref().amounts() {
        let Some(written) = written else { continue };
        let at = written.span().start;
        let name = span.name();
        let bound = match span {
            Span::Calendar(_) => MAX_BUDGET,
            Span::RollingHour | Span::RollingDay => MAX_ROLLING_BUDGET,
        };
        match parse_amount(written.get_ref()) {
            Ok(0) => {
                d.error(
                    at,
                    format!(
                        "{context}: {field}.{name} must be more than 0 (a budget of nothing \
                         would refuse every call; [[clients]] can keep a tenant away instead)"
                    ),
                );
                valid = false;
            }
            Ok(micros) if micros > bound => {
                d.error(
                    at,
                    format!(
                        "{context}: {field}.{name} must be at most {} (got {})",
                        format_amount(bound),
                        written.get_ref()
                    ),
                );
                valid = false;
            }
            Ok(micros) => amounts.push((span, micros)),
            Err(problem) => {
                d.error(at, format!("{context}: {field}.{name}: {problem}"));
                valid = false;
            }
        }
    }
    if amounts.is_empty() && valid {
        d.error(
            raw.span().start,
            format!(
                "{context}: {field} names no amount: give day, week, month, rolling_hour or \
                 rolling_day, as {field} = {{ day = \"10.00\" }}"
            ),
        );
        return None;
    }
    valid.then(|| Budget::new(amounts))
}

/// A limit's `price`: `input` and `output` required, cache reads and
/// writes at the input price unless given.
pub(super) fn resolve_price(
    raw: &Spanned<RawPrice>,
    context: &str,
    d: &mut Diagnostics,
) -> Option<Price> {
    let price = raw.get_ref();
    let mut valid = true;
    let mut amount = |written: &Option<Spanned<String>>, name: &str, d: &mut Diagnostics| {
        let written = written.as_ref()?;
        match parse_amount(written.get_ref()) {
            Ok(micros) => Some(micros),
            Err(problem) => {
                d.error(
                    written.span().start,
                    format!("{context}: price.{name}: {problem}"),
                );
                valid = false;
                None
            }
        }
    };
    let input = amount(&price.input, "input", d);
    let output = amount(&price.output, "output", d);
    let cached_input = amount(&price.cached_input, "cached_input", d);
    let cache_write = amount(&price.cache_write, "cache_write", d);
    for (given, name) in [(&price.input, "input"), (&price.output, "output")] {
        if given.is_none() {
            d.error(
                raw.span().start,
                format!("{context}: price needs {name} (per million tokens, as \"2.50\")"),
            );
            valid = false;
        }
    }
    if !valid {
        return None;
    }
    let (input, output) = (input?, output?);
    Some(Price {
        input,
        cached_input: cached_input.unwrap_or(input),
        cache_write: cache_write.unwrap_or(input),
        output,
    })
}

/// Gives every limit that a budget applies to (its own, its tenants', its
/// group's) a price: its own `price`, else the price table's for its
/// `model`. A budgeted limit without one is an error naming the model.
pub(super) fn price_budgeted_limits(
    config: &mut Config,
    raw: &[Spanned<RawLimit>],
    d: &mut Diagnostics,
) {
    let budgeted_groups: Vec<String> = config
        .groups
        .iter()
        .filter(|group| group.budgets.any())
        .map(|group| group.name.clone())
        .collect();
    for limit in &mut config.limits {
        let group_budget = limit
            .group
            .as_ref()
            .filter(|group| budgeted_groups.contains(group));
        if limit.price.is_some() || !(limit.budgets.any() || group_budget.is_some()) {
            continue;
        }
        limit.price = limit
            .model
            .as_deref()
            .and_then(|model| PriceTable::shipped().lookup(model))
            .map(|priced| priced.price);
        if limit.price.is_some() {
            continue;
        }
        let whose = match group_budget {
            Some(group) if !limit.budgets.any() => format!("group {group:?}'s budget applies"),
            _ => "it has a budget".to_string(),
        };
        let why = match &limit.model {
            Some(model) => format!("model {model:?} is not in the price table (docs/prices.md)"),
            None => "it names no model whose price the table knows".to_string(),
        };
        let (index, at) = raw
            .iter()
            .enumerate()
            .find(|(_, entry)| {
                entry
                    .get_ref()
                    .name
                    .as_ref()
                    .is_some_and(|name| *name.get_ref() == limit.name)
            })
            .map_or((0, 0), |(index, entry)| (index, entry.span().start));
        d.error(
            at,
            format!(
                "limits[{index}] {:?}: {whose} but {why}: set price = {{ input = \"2.50\", \
                 output = \"10.00\" }} (per million tokens)",
                limit.name
            ),
        );
    }
}
