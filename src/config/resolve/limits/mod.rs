//! `[[limits]]`: each limit's name and group, its buckets ([`buckets`]),
//! how it counts prompts ([`counting`]), and how it charges and settles
//! (its provider preset's rules unless it sets its own).

mod buckets;
mod counting;

use toml::Spanned;

use crate::config::diagnostics::{
    DeclaredNames, Diagnostics, check_int, check_reference, declared_list,
};
use crate::config::model::{
    DEFAULT_BURST_HEADROOM_MS, DEFAULT_CONCURRENT_TIMEOUT_MS, DEFAULT_MAX_OUTPUT_TOKENS,
    DEFAULT_MAX_PAUSE_MS, EnforcementWindow, GroupConfig, LimitConfig, MAX_BURST,
    MAX_BURST_HEADROOM_MS, MAX_CONCURRENT, MAX_CONCURRENT_TIMEOUT_MS, MAX_MAX_PAUSE_MS,
};
use crate::config::raw::{RawGroup, RawLimit};
use crate::tokens::Provider;

use super::budgets::{resolve_budgets, resolve_price};

/// The limits that could be resolved, and the names declared.
pub(super) fn resolve_limits(
    raw: &[Spanned<RawLimit>],
    raw_groups: &[Spanned<RawGroup>],
    groups: &[GroupConfig],
    d: &mut Diagnostics,
) -> (Vec<LimitConfig>, DeclaredNames) {
    let mut names = DeclaredNames::new("limits", "limit");
    let mut limits = Vec::new();
    for (index, entry) in raw.iter().enumerate() {
        let limit = entry.get_ref();
        let entry_at = entry.span().start;
        let named = names.declare(d, index, limit.name.as_ref(), entry_at);
        if let Some(group) = &limit.group {
            check_group(group, raw_groups, groups, &named.context, d);
        }
        if let Some(resolved) = resolve_limit(limit, &named.context, entry_at, d) {
            limits.push(LimitConfig {
                name: named.name.unwrap_or_default(),
                ..resolved
            });
        }
    }
    (limits, names)
}

/// Reports a `group` no `[[groups]]` entry declares.
fn check_group(
    group: &Spanned<String>,
    raw_groups: &[Spanned<RawGroup>],
    groups: &[GroupConfig],
    context: &str,
    d: &mut Diagnostics,
) {
    let written = raw_groups.iter().map(|g| g.get_ref().name.as_ref());
    check_reference(d, group, written, |name| {
        format!(
            "{context}: group {name:?} is not a declared group ({})",
            declared_list(groups.iter().map(|g| g.name.as_str()), "[[groups]]")
        )
    });
}

/// The resolved limit (name left empty for the caller), or `None` when a
/// required value is missing or wrong.
fn resolve_limit(
    limit: &RawLimit,
    context: &str,
    entry_at: usize,
    d: &mut Diagnostics,
) -> Option<LimitConfig> {
    // Every step runs, so that one pass reports every problem.
    let burst_headroom_ms = match &limit.burst_headroom_ms {
        Some(v) => check_int(d, context, "burst_headroom_ms", v, 0, MAX_BURST_HEADROOM_MS),
        None => Some(DEFAULT_BURST_HEADROOM_MS),
    };
    let max_pause_ms = match &limit.max_pause_ms {
        Some(v) => check_int(d, context, "max_pause_ms", v, 0, MAX_MAX_PAUSE_MS),
        None => Some(DEFAULT_MAX_PAUSE_MS),
    };
    let max_concurrent = limit
        .max_concurrent
        .as_ref()
        .map(|v| check_int(d, context, "max_concurrent", v, 1, MAX_CONCURRENT));
    let concurrent_timeout_ms = match &limit.concurrent_timeout_ms {
        Some(v) => check_int(
            d,
            context,
            "concurrent_timeout_ms",
            v,
            1000,
            MAX_CONCURRENT_TIMEOUT_MS,
        ),
        None => Some(DEFAULT_CONCURRENT_TIMEOUT_MS),
    };
    let provider = limit
        .provider
        .as_ref()
        .map_or(Provider::Generic, |p| *p.get_ref());
    let enforcement_window = limit
        .enforcement_window
        .as_ref()
        .map_or(EnforcementWindow::of_provider(provider), |w| *w.get_ref());
    let buckets = buckets::resolve_buckets(limit, enforcement_window, context, entry_at, d);
    let counting = counting::resolve_counting(limit, provider, context, entry_at, d);
    let default_max_output_tokens = match &limit.default_max_output_tokens {
        Some(v) => check_int(d, context, "default_max_output_tokens", v, 0, MAX_BURST),
        None => Some(DEFAULT_MAX_OUTPUT_TOKENS),
    };
    let budgets = resolve_budgets(
        &limit.budget,
        &limit.tenant_budget,
        &limit.tenant_budgets,
        context,
        d,
    );
    let price = limit
        .price
        .as_ref()
        .map(|price| resolve_price(price, context, d));
    let (buckets, counting) = (buckets?, counting?);
    Some(LimitConfig {
        name: String::new(),
        tokens_per_minute: buckets.combined.per_minute,
        requests_per_minute: buckets.requests_per_minute,
        burst_tokens: buckets.combined.burst,
        burst_requests: buckets.burst_requests,
        input_tokens_per_minute: buckets.input.map(|input| input.per_minute),
        output_tokens_per_minute: buckets.output.map(|output| output.per_minute),
        burst_input_tokens: buckets.input.map(|input| input.burst),
        burst_output_tokens: buckets.output.map(|output| output.burst),
        model: limit.model.as_ref().map(|m| m.get_ref().clone()),
        tenant_share: buckets.tenant_share,
        max_request_tokens: buckets.max_request_tokens,
        group: limit.group.as_ref().map(|g| g.get_ref().clone()),
        provider,
        tokenizer: counting.tokenizer,
        chars_per_token: counting.chars_per_token,
        safety_factor: counting.safety_factor,
        default_max_output_tokens: default_max_output_tokens?,
        cost_rule: limit
            .cost_rule
            .as_ref()
            .map_or(provider.cost_rule(), |rule| *rule.get_ref()),
        settle: limit
            .settle
            .as_ref()
            .map_or(provider.settle_rule(), |rule| *rule.get_ref()),
        learn_max_output: limit
            .learn_max_output
            .as_ref()
            .is_some_and(|learn| *learn.get_ref()),
        burst_headroom_ms: burst_headroom_ms?,
        max_pause_ms: max_pause_ms?,
        enforcement_window,
        mode: limit
            .mode
            .as_ref()
            .map_or_else(Default::default, |mode| *mode.get_ref()),
        max_concurrent: max_concurrent.map_or(Some(None), |checked| checked.map(Some))?,
        concurrent_timeout_ms: concurrent_timeout_ms?,
        tokens_per_second: buckets.other_windows[0],
        tokens_per_hour: buckets.other_windows[1],
        tokens_per_day: buckets.other_windows[2],
        requests_per_second: buckets.other_windows[3],
        requests_per_hour: buckets.other_windows[4],
        requests_per_day: buckets.other_windows[5],
        budgets: budgets?,
        price: price.map_or(Some(None), |resolved| resolved.map(Some))?,
    })
}
