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
            refund_unused,
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

/// Budgets shared by every candidate deployment: the key's, then for the
/// tenant and each of its ancestors (nearest first) its tenant scope, its
/// tenant×model scope and its `shadow_limits`. Each level's `shadow` puts
/// that level's budgets in shadow (the key's go with its own tenant); its
/// `shadow_limits` add shadow budgets of its tenant scope.
pub fn tenant_budgets(
    ks: &KeySpace,
    policy: &Policy,
    tenant: &TenantPolicy,
    key: &KeyPolicy,
    model: &ModelPolicy,
) -> Vec<BudgetSpec> {
    let mut out = Vec::new();
    for (depth, level) in policy.lineage(tenant).enumerate() {
        let from = out.len();
        let name = || -> std::sync::Arc<str> { level.name.as_str().into() };
        out.extend(scope_budgets(ks, Scope::Tenant(name()), &level.limits, true));
        if depth == 0 {
            out.extend(scope_budgets(
                ks,
                Scope::Key(name(), key.id.as_str().into()),
                &key.limits,
                true,
            ));
        }
        if let Some(l) = level.model_limits.get(&model.name) {
            out.extend(scope_budgets(
                ks,
                Scope::TenantModel(name(), model.name.as_str().into()),
                l,
                true,
            ));
        }
        if level.shadow {
            for s in &mut out[from..] {
                s.shadow = true;
            }
        }
        out.extend(shadow_budgets(ks, Scope::Tenant(name()), &level.shadow_limits));
    }
    out
}

/// Budgets of one end user (`hash`, from `config::end_user`) of `tenant`:
/// for the tenant and each ancestor with `end_user_limits`, the scope
/// `end_user:<level>/<hash>` under those limits (one end user is then
/// counted once per level that limits end users, across the level's whole
/// subtree). A level in shadow has its end-user budgets in shadow.
pub fn end_user_budgets(
    ks: &KeySpace,
    policy: &Policy,
    tenant: &TenantPolicy,
    hash: &std::sync::Arc<str>,
) -> Vec<BudgetSpec> {
    let mut out = Vec::new();
    for level in policy.lineage(tenant) {
        if level.end_user_limits.is_empty() {
            continue;
        }
        let scope = Scope::EndUser(level.name.as_str().into(), hash.clone());
        let mut specs = scope_budgets(ks, scope, &level.end_user_limits, true);
        for s in &mut specs {
            s.shadow = level.shadow;
        }
        out.extend(specs);
    }
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
