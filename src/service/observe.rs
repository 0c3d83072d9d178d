//! What a call leaves behind besides its answer: its metrics (when
//! `[metrics] listen` serves them), the tenants recently seen per limit (for
//! `Inspect`, always), and at DEBUG one decision line
//! per acquire, report and release, with structured fields so that JSON
//! logs are queryable. Client-supplied strings are logged as values (quoted
//! and escaped), never with `Display`, so a newline cannot forge a line.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use super::acquire::CONCURRENT;
use super::{Call, Reported, Service, ServiceError, Snapshot};
use crate::config::LimitConfig;
use crate::leases::LeaseTag;
use crate::limiter::BucketRole;
use crate::metrics::registry::{AcquireLabels, SettleLabels, ShadowLabels};
use crate::metrics::{LimitMeters, Name, TenantLabel};
use crate::proto::{Cost, MAX_NAME_LEN, Response};

/// Tenants remembered per limit, most recent first.
pub const RECENT_TENANTS: usize = 32;

/// What the service remembers of a call to record its answer.
pub(super) enum Observed<'a> {
    Acquire {
        limit: Name,
        /// The limit's own series, when it is configured.
        meters: Option<&'a LimitMeters>,
        tenant: TenantLabel,
        /// The request's own fields, kept only while DEBUG is on.
        log: Option<AcquireLog>,
    },
    Settle {
        release: bool,
        lease: u64,
        /// What a report says was used; nothing for a release.
        usage: Reported,
    },
    Other,
}

/// An acquire as the decision log shows it.
pub(super) struct AcquireLog {
    limit: String,
    tenant: Option<String>,
    priority: Option<String>,
    input_tokens: u64,
    output_tokens: u64,
    /// Messages to count, for a messages cost.
    messages: usize,
}

/// The tenants recently seen on each limit with tenant shares, bounded.
#[derive(Default)]
pub(super) struct RecentTenants {
    by_limit: Mutex<HashMap<Name, VecDeque<String>>>,
}

impl RecentTenants {
    fn note(&self, limit: &Name, tenant: &str) {
        let mut by_limit = self
            .by_limit
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let recent = by_limit.entry(limit.clone()).or_default();
        if recent.front().is_some_and(|first| first == tenant) {
            return;
        }
        match recent.iter().position(|seen| seen == tenant) {
            Some(at) => {
                if let Some(seen) = recent.remove(at) {
                    recent.push_front(seen);
                }
            }
            None => {
                recent.truncate(RECENT_TENANTS - 1);
                recent.push_front(tenant.to_string());
            }
        }
    }

    /// The tenants seen on `limit`, most recent first.
    pub(super) fn of(&self, limit: &str) -> Vec<String> {
        let by_limit = self
            .by_limit
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        by_limit
            .get(limit)
            .map(|recent| recent.iter().cloned().collect())
            .unwrap_or_default()
    }
}

impl Service {
    /// Takes note of `call` before it is answered.
    pub(super) fn observe<'a>(&self, snapshot: &'a Snapshot, call: &Call) -> Observed<'a> {
        match call {
            Call::Acquire(acquire, _) => {
                let (limit, meters) = snapshot.labels.limit(&acquire.limit);
                let tenant = acquire.tenant.as_deref();
                if let Some(tenant) = tenant.filter(|t| t.len() <= MAX_NAME_LEN) {
                    let config = snapshot.planner.config();
                    let shared = config
                        .limit(&acquire.limit)
                        .is_some_and(|l| l.tenant_share.is_some());
                    if shared {
                        self.recent.note(&limit, tenant);
                    }
                }
                let debug = tracing::enabled!(tracing::Level::DEBUG);
                if !self.metered && !debug {
                    return Observed::Other;
                }
                let log = debug.then(|| {
                    let (input_tokens, output_tokens, messages) = match &acquire.cost {
                        Cost::Tokens {
                            input_tokens,
                            output_tokens,
                        } => (*input_tokens, *output_tokens, 0),
                        Cost::Messages(request) => (
                            0,
                            request.max_output_tokens.unwrap_or(0),
                            request.messages.len(),
                        ),
                        Cost::Conversation(conversation) => (
                            0,
                            conversation.max_output_tokens.unwrap_or(0),
                            conversation.messages.len(),
                        ),
                    };
                    AcquireLog {
                        limit: acquire.limit.clone(),
                        tenant: acquire.tenant.clone(),
                        priority: acquire.priority.clone(),
                        input_tokens,
                        output_tokens,
                        messages,
                    }
                });
                Observed::Acquire {
                    limit,
                    meters,
                    tenant: snapshot.labels.tenant(tenant),
                    log,
                }
            }
            Call::Report { .. } | Call::Release { .. }
                if !self.metered && !tracing::enabled!(tracing::Level::DEBUG) =>
            {
                Observed::Other
            }
            Call::Report { lease, usage } => Observed::Settle {
                release: false,
                lease: *lease,
                usage: *usage,
            },
            Call::Release { lease } => Observed::Settle {
                release: true,
                lease: *lease,
                usage: Reported::Tokens {
                    input: 0,
                    output: 0,
                },
            },
            _ => Observed::Other,
        }
    }

    /// Counts and logs the answer to an observed call.
    pub(super) fn record(
        &self,
        snapshot: &Snapshot,
        observed: Observed<'_>,
        answer: &Result<Response, ServiceError>,
    ) {
        match observed {
            Observed::Acquire {
                limit,
                meters,
                tenant,
                log,
            } => self.record_acquire(limit, meters, tenant, log, answer),
            Observed::Settle {
                release,
                lease,
                usage,
            } => {
                // A settled lease's tag goes; a failed settlement keeps it
                // for the retry.
                let tag = match answer {
                    Ok(_) => self.leases.untag(lease),
                    Err(_) => self.leases.tag_of(lease),
                };
                let name = tag.as_ref().map_or("", |tag| &*tag.limit);
                // The tokens the limit's provider counts, as settlement counted them.
                let cache_reads_count = snapshot
                    .planner
                    .config()
                    .limit(name)
                    .is_none_or(|limit| limit.provider.counts_cache_reads());
                let (input_tokens, output_tokens) = usage.rate_tokens(cache_reads_count);
                let (limit, meters) = snapshot.labels.limit(name);
                let returned = match answer {
                    Ok(Response::Settled { tokens_returned }) => *tokens_returned,
                    Ok(Response::Released { tokens_returned }) => *tokens_returned as i64,
                    _ => 0,
                };
                let outcome = match answer {
                    Ok(_) => "settled",
                    Err(failure) => failure.code().label(),
                };
                match meters.filter(|_| self.metered) {
                    Some(meters) if answer.is_ok() => {
                        let settled = if release {
                            &meters.releases_settled
                        } else {
                            &meters.reports_settled
                        };
                        settled.inc();
                        if returned > 0 {
                            meters.refunded_tokens.inc_by(returned as u64);
                        }
                        if let (Some(tag), false) = (&tag, release) {
                            let used = input_tokens.saturating_add(output_tokens);
                            meters
                                .estimation_error
                                .observe(tag.tokens as f64 - used as f64);
                        }
                    }
                    _ if self.metered => {
                        let labels = SettleLabels {
                            limit: limit.clone(),
                            outcome,
                        };
                        let family = if release {
                            &self.metrics.releases
                        } else {
                            &self.metrics.reports
                        };
                        family.get_or_create(&labels).inc();
                    }
                    _ => {}
                }
                let request = if release { "release" } else { "report" };
                let (limit, code) = (&*limit, answer.as_ref().err().map(|f| f.code().label()));
                tracing::debug!(
                    request,
                    lease,
                    limit,
                    input_tokens,
                    output_tokens,
                    outcome,
                    tokens_returned = returned,
                    code,
                    "decision"
                );
            }
            Observed::Other => {}
        }
    }

    fn record_acquire(
        &self,
        limit: Name,
        meters: Option<&LimitMeters>,
        tenant: TenantLabel,
        log: Option<AcquireLog>,
        answer: &Result<Response, ServiceError>,
    ) {
        if let Ok(Response::Granted { lease, tokens, .. }) = answer {
            // So that its report is counted and logged under its limit.
            let tag = LeaseTag {
                limit: limit.clone(),
                tokens: *tokens,
                tenant: tenant.name.clone(),
            };
            self.leases.tag(*lease, tag);
        }
        if let Some(log) = &log {
            log_acquire(log, answer);
        }
        if !self.metered {
            return;
        }
        let (outcome, reason) = match answer {
            Ok(Response::Granted {
                tokens, waited_ms, ..
            }) => match meters {
                Some(meters) => {
                    let (acquires, acquired) = meters.granted(&self.metrics, &limit, &tenant);
                    acquires.inc();
                    acquired.inc_by(*tokens);
                    meters.waits.observe(*waited_ms as f64 / 1000.0);
                    return;
                }
                // Only a configured limit grants.
                None => ("granted", ""),
            },
            Ok(Response::Denied { bucket, .. }) => ("denied", bucket_label(bucket)),
            Ok(_) => ("granted", ""),
            Err(failure) => ("error", failure.code().label()),
        };
        let labels = AcquireLabels {
            limit,
            tenant: tenant.name,
            outcome,
            reason,
        };
        self.metrics.acquires.get_or_create(&labels).inc();
    }
}

/// The `reason` label of a denial: the bucket's role name, or
/// `concurrent` for a limit's slots.
fn bucket_label(bucket: &str) -> &'static str {
    BucketRole::all()
        .map(|role| role.name())
        .chain([CONCURRENT])
        .find(|name| *name == bucket)
        .unwrap_or("other")
}

/// The decision line of one acquire.
fn log_acquire(log: &AcquireLog, answer: &Result<Response, ServiceError>) {
    let (mut lease, mut tokens, mut waited_ms, mut retry_after_ms) = (None, None, None, None);
    let (mut bucket, mut code, mut reason) = (None, None, None);
    let outcome = match answer {
        Ok(Response::Granted {
            lease: id,
            tokens: granted,
            waited_ms: waited,
        }) => {
            (lease, tokens, waited_ms) = (Some(*id), Some(*granted), Some(*waited));
            "granted"
        }
        Ok(Response::Denied {
            retry_after_ms: retry,
            bucket: denying,
        }) => {
            (retry_after_ms, bucket) = (Some(*retry), Some(denying.as_str()));
            "denied"
        }
        Ok(_) => "answered",
        Err(failure) => {
            (code, reason) = (Some(failure.code().label()), Some(failure.to_string()));
            "error"
        }
    };
    tracing::debug!(
        request = "acquire",
        limit = log.limit.as_str(),
        tenant = log.tenant.as_deref(),
        priority = log.priority.as_deref(),
        input_tokens = log.input_tokens,
        output_tokens = log.output_tokens,
        messages = log.messages,
        outcome,
        lease,
        tokens,
        waited_ms,
        bucket,
        retry_after_ms,
        code,
        reason = reason.as_deref(),
        "decision"
    );
}

impl Service {
    /// Counts a shadow limit's decision.
    pub(super) fn count_shadow(
        &self,
        snapshot: &Snapshot,
        limit: &LimitConfig,
        decision: &'static str,
    ) {
        if !self.metered {
            return;
        }
        let (limit, _) = snapshot.labels.limit(&limit.name);
        let labels = ShadowLabels { limit, decision };
        self.metrics.shadow_decisions.get_or_create(&labels).inc();
    }
}
