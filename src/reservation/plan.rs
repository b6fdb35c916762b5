//! Which budgets a request touches, from policy: the one place that turns
//! configured [`Limits`] into [`BudgetSpec`]s.

use crate::config::{KeyPolicy, Limits, ModelPolicy, Policy, TenantPolicy, UpstreamPolicy};
use crate::reserve::keys::KeySpace;
use crate::reserve::{BudgetKind, BudgetName, BudgetSpec, Scope, Window};

/// Budgets of one scope under `limits`.
pub fn scope_budgets(
    ks: &KeySpace,
    scope: Scope,
    limits: &Limits,
    refund_unused: bool,
) -> Vec<BudgetSpec> {
    let mut out = Vec::new();
    let mut push = |name: BudgetName, kind: BudgetKind| {
        out.push(BudgetSpec {
            key: ks.budget(&scope, name),
            scope: scope.clone(),
            name,
            kind,
            // Providers bill actual usage: dollars always go back to it.
            refund_unused: refund_unused || name.counts_usd(),
            shadow: false,
        });
    };
    if let Some(rpm) = limits.rpm {
        push(
            BudgetName::Rpm,
            BudgetKind::Bucket {
                per_minute: rpm,
                burst: limits.rpm_burst.unwrap_or(rpm),
            },
        );
    }
    if let Some(tpm) = limits.tpm {
        push(
            BudgetName::Tpm,
            BudgetKind::Bucket {
                per_minute: tpm,
                burst: limits.tpm_burst.unwrap_or(tpm),
            },
        );
    }
    if let Some(max) = limits.max_concurrent {
        push(BudgetName::MaxConcurrent, BudgetKind::Concurrency { max });
    }
    if let Some(limit) = limits.tokens_per_day {
        push(
            BudgetName::TokensPerDay,
            BudgetKind::Quota {
                limit,
                window: Window::Day,
            },
        );
    }
    if let Some(limit) = limits.tokens_per_month {
        push(
            BudgetName::TokensPerMonth,
            BudgetKind::Quota {
                limit,
                window: Window::Month,
            },
        );
    }
    if let Some(limit) = limits.requests_per_day {
        push(
            BudgetName::RequestsPerDay,
            BudgetKind::Quota {
                limit,
                window: Window::Day,
            },
        );
    }
    // Dollar budgets: calendar quotas whose unit is the micro-dollar.
    for (name, limit, window) in [
        (BudgetName::UsdPerDay, limits.usd_per_day, Window::Day),
        (BudgetName::UsdPerMonth, limits.usd_per_month, Window::Month),
    ] {
        if let Some(limit) = limit {
            push(name, BudgetKind::Quota { limit, window });
        }
    }
    out
}

/// Shadow budgets of one scope: evaluated and debited like the others but
/// never enforced; stored under their own keys.
pub fn shadow_budgets(ks: &KeySpace, scope: Scope, limits: &Limits) -> Vec<BudgetSpec> {
    scope_budgets(ks, scope, limits, true)
        .into_iter()
        .map(|mut s| {
            s.key = ks.shadow_budget(&s.scope, s.name);
            s.shadow = true;
            s
        })
        .collect()
}

/// Budgets shared by every candidate deployment: tenant, key, tenant×model.
/// A tenant in shadow mode has every one of them in shadow; its
/// `shadow_limits` add shadow budgets of the tenant scope.
pub fn tenant_budgets(
    ks: &KeySpace,
    tenant: &TenantPolicy,
    key: &KeyPolicy,
    model: &ModelPolicy,
) -> Vec<BudgetSpec> {
    let mut out = scope_budgets(
        ks,
        Scope::Tenant(tenant.name.as_str().into()),
        &tenant.limits,
        true,
    );
    out.extend(scope_budgets(
        ks,
        Scope::Key(tenant.name.as_str().into(), key.id.as_str().into()),
        &key.limits,
        true,
    ));
    if let Some(l) = tenant.model_limits.get(&model.name) {
        out.extend(scope_budgets(
            ks,
            Scope::TenantModel(tenant.name.as_str().into(), model.name.as_str().into()),
            l,
            true,
        ));
    }
    if tenant.shadow {
        for s in &mut out {
            s.shadow = true;
        }
    }
    out.extend(shadow_budgets(
        ks,
        Scope::Tenant(tenant.name.as_str().into()),
        &tenant.shadow_limits,
    ));
    out
}

/// Budgets of one upstream deployment.
pub fn upstream_budgets(ks: &KeySpace, upstream: &UpstreamPolicy) -> Vec<BudgetSpec> {
    scope_budgets(
        ks,
        Scope::Upstream(upstream.name.as_str().into()),
        &upstream.limits,
        upstream.refund_unused,
    )
}

/// Candidate budget lists for a model's deployments, in preference order.
pub fn candidate_budgets(
    ks: &KeySpace,
    policy: &Policy,
    model: &ModelPolicy,
) -> Vec<Vec<BudgetSpec>> {
    model
        .upstreams
        .iter()
        .map(|&i| upstream_budgets(ks, &policy.upstreams[i]))
        .collect()
}

/// The smallest token capacity a request must fit: the minimum over the
/// common budgets and the largest over candidates (a request needs only one
/// deployment to fit). `None` when no token budget applies.
pub fn tightest_token_capacity<C: AsRef<[BudgetSpec]>>(
    common: &[BudgetSpec],
    candidates: &[C],
) -> Option<u64> {
    let cap = |specs: &[BudgetSpec]| {
        specs
            .iter()
            .filter(|s| s.name.counts_tokens())
            .map(|s| s.capacity())
            .min()
    };
    let common_cap = cap(common);
    let cand_cap = if candidates.iter().any(|c| cap(c.as_ref()).is_none()) {
        None
    } else {
        candidates.iter().filter_map(|c| cap(c.as_ref())).max()
    };
    match (common_cap, cand_cap) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
