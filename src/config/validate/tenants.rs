//! Validation of `[[tenants]]`, their keys and limits.

use std::collections::{BTreeMap, HashMap};

use super::V;
use crate::config::ids::is_valid_id;
use crate::config::model_names::NamePattern;
use crate::config::output_reservation::OutputReservation;
use crate::config::raw::RawConfig;
use crate::config::*;

/// The digest-to-(tenant, key) index of every configured key.
pub(super) type KeyIndex = foldhash::HashMap<[u8; 32], KeyRef>;

/// Validates `[[tenants]]` and their keys; returns them and the key index.
pub(super) fn tenants(
    v: &mut V,
    raw: &RawConfig,
    model_index: &crate::config::model_names::ModelIndex,
) -> (Vec<TenantPolicy>, KeyIndex) {
    let mut tenants = Vec::new();
    let mut tenant_names = HashMap::new();
    let mut key_index = KeyIndex::default();
    for (i, t) in raw.tenants.iter().enumerate() {
        let path = format!("tenants[{i}]");
        if !is_valid_id(&t.name) {
            v.err(format!("{path}.name"), "must match [A-Za-z0-9._-]{1,64}");
        }
        if tenant_names.insert(t.name.clone(), i).is_some() {
            v.err(
                format!("{path}.name"),
                format!("duplicate tenant {:?}", t.name),
            );
        }
        let mut keys = Vec::new();
        let mut key_ids = HashMap::new();
        for (j, k) in t.keys.iter().enumerate() {
            let kp = format!("{path}.keys[{j}]");
            if !is_valid_id(&k.id) {
                v.err(format!("{kp}.id"), "must match [A-Za-z0-9._-]{1,64}");
            }
            if key_ids.insert(k.id.clone(), j).is_some() {
                v.err(format!("{kp}.id"), format!("duplicate key id {:?}", k.id));
            }
            let digest = k.sha256.to_ascii_lowercase();
            let mut raw = [0u8; 32];
            if hex::decode_to_slice(&digest, &mut raw).is_err() {
                v.err(
                    format!("{kp}.sha256"),
                    "must be 64 hex digits (run `budgetgate hash-key`)",
                );
            } else if let Some(first) =
                key_index.insert(raw, key_ref(i, j, k.terms.expires_at, None))
            {
                // Both places named: when one is the control database's,
                // the composition traces the collision to it.
                v.err(
                    format!("{kp}.sha256"),
                    format!(
                        "the same key is configured twice (also at tenants[{}].keys[{}])",
                        first.tenant, first.key
                    ),
                );
            }
            // Runtime keys only (the control database checked them when
            // they were written): rotated secrets still in their overlap.
            for (old, until) in &k.terms.retiring {
                let mut d = [0u8; 32];
                if hex::decode_to_slice(old, &mut d).is_ok() {
                    key_index
                        .entry(d)
                        .or_insert(key_ref(i, j, k.terms.expires_at, Some(*until)));
                }
            }
            keys.push(KeyPolicy {
                id: k.id.clone(),
                sha256: digest,
                limits: v.limits(&format!("{kp}.limits"), &k.limits),
                priority: super::queue::class(v, &format!("{kp}.priority"), k.priority.as_deref()),
                weight: super::queue::weight(v, &format!("{kp}.weight"), k.weight),
                expires_at: k.terms.expires_at,
                // A name no entry serves any longer (or, from an older
                // database, a malformed pattern) is dropped: the key loses
                // it, never gains.
                allowed_models: k.terms.allowed_models.as_ref().map(|names| {
                    names
                        .iter()
                        .filter_map(|n| NamePattern::parse(n).ok())
                        .filter(|p| match p {
                            NamePattern::Exact(n) => model_index.resolve(n).is_some(),
                            NamePattern::Prefix(_) => true,
                        })
                        .collect()
                }),
                // Resolved below, with the tenant's settings.
                output_reservation: None,
                run_required: k.run_required,
                runs_per_day: v.positive(
                    &format!("{kp}.runs_per_day"),
                    k.runs_per_day,
                    crate::config::bounds::MAX_QUOTA,
                ),
            });
        }
        let mut model_limits = BTreeMap::new();
        for (model, l) in &t.model_limits {
            let mp = format!("{path}.model_limits.{model}");
            if !model_index.contains(model) {
                v.err(&mp, format!("unknown model {model:?}"));
            }
            model_limits.insert(model.clone(), v.limits(&mp, l));
        }
        let on_store_error = match t.on_store_error.as_deref().unwrap_or("fail_open") {
            "fail_open" => OnStoreError::FailOpen,
            "fail_closed" => OnStoreError::FailClosed,
            other => {
                v.err(
                    format!("{path}.on_store_error"),
                    format!("must be \"fail_open\" or \"fail_closed\", not {other:?}"),
                );
                OnStoreError::FailOpen
            }
        };
        if let Some(other) = t
            .on_short_output
            .as_deref()
            .filter(|s| !matches!(*s, "refuse" | "clamp"))
        {
            v.err(
                format!("{path}.on_short_output"),
                format!("must be \"refuse\" or \"clamp\", not {other:?}"),
            );
        }
        tenants.push(TenantPolicy {
            name: t.name.clone(),
            keys,
            limits: v.limits(&format!("{path}.limits"), &t.limits),
            model_limits,
            on_store_error,
            // Resolved below, from the tenant up.
            on_short_output: OnShortOutput::Refuse,
            shadow: t.shadow.unwrap_or(false),
            shadow_limits: v.limits(&format!("{path}.shadow_limits"), &t.shadow_limits),
            allow_unrecorded_previous_response: t
                .allow_unrecorded_previous_response
                .unwrap_or(false),
            unrecorded_previous_response_tokens: v
                .positive(
                    &format!("{path}.unrecorded_previous_response_tokens"),
                    t.unrecorded_previous_response_tokens,
                    crate::config::bounds::MAX_LIMIT,
                )
                .unwrap_or(8192),
            allowed_provider_objects: t.allowed_provider_objects.clone(),
            allow_file_ids: t.allow_file_ids.unwrap_or(false),
            // Resolved below, once every name is known.
            parent: None,
            ancestors: Vec::new(),
            end_user_limits: v.limits(&format!("{path}.end_user_limits"), &t.end_user_limits),
            end_user_required: t.end_user_required.unwrap_or(false),
            reads_end_user: false,
            // Resolved below, from the tenant up.
            priority: super::queue::class(v, &format!("{path}.priority"), t.priority.as_deref())
                .unwrap_or_default(),
            weight: super::queue::weight(v, &format!("{path}.weight"), t.weight).unwrap_or(1),
            // Resolved below, from the tenant up.
            output_reservation: OutputReservation::default(),
            // Resolved below, from the tenant up.
            runs: crate::config::run::RunSettings::default(),
        });
    }
    super::tree::resolve(v, raw, &mut tenants, &tenant_names);
    // The tenant's own setting, else its nearest ancestor's.
    for (i, t) in tenants.iter_mut().enumerate() {
        let set = std::iter::once(i)
            .chain(t.ancestors.iter().copied())
            .filter_map(|l| raw.tenants[l].on_short_output.as_deref())
            .next();
        if set == Some("clamp") {
            t.on_short_output = OnShortOutput::Clamp;
        }
        let lineage = || std::iter::once(i).chain(t.ancestors.iter().copied());
        if let Some(c) = lineage()
            .find_map(|l| raw.tenants[l].priority.as_deref())
            .and_then(crate::config::queue::Class::parse)
        {
            t.priority = c;
        }
        if let Some(w) = lineage()
            .find_map(|l| raw.tenants[l].weight)
            .filter(|&w| w > 0)
        {
            t.weight = w as u64;
        }
        output_reservation(v, raw, i, t);
        t.runs = run_settings(v, raw, i, &t.ancestors);
    }

    (tenants, key_index)
}

/// The run settings of tenant `i`: each its own, else its nearest
/// ancestor's (`run_required`: any level's). Errors are reported at the
/// level that wrote the setting, once.
fn run_settings(
    v: &mut V,
    raw: &RawConfig,
    i: usize,
    ancestors: &[usize],
) -> crate::config::run::RunSettings {
    use crate::config::run::{parse, parse_ttl, RunLimits, RunSettings};
    let lineage: Vec<usize> = std::iter::once(i)
        .chain(ancestors.iter().copied())
        .collect();
    let own = i;
    let mut limits = |field: &str, pick: fn(&crate::config::raw::RawTenant) -> Option<&String>| {
        let l = lineage
            .iter()
            .find_map(|&l| pick(&raw.tenants[l]).map(|t| (l, t)))?;
        match parse(l.1) {
            Ok(x) => Some(x),
            Err(e) => {
                if l.0 == own {
                    v.err(
                        format!("tenants[{own}].{field}"),
                        format!("cannot be read: {e}"),
                    );
                }
                None
            }
        }
    };
    let max = limits("run_limits_max", |t| t.run_limits_max.as_ref()).unwrap_or_default();
    let default =
        limits("run_limits_default", |t| t.run_limits_default.as_ref()).unwrap_or_default();
    let path = |f: &str| format!("tenants[{own}].{f}");
    if max.window.is_some() && raw.tenants[own].run_limits_max.is_some() {
        v.err(
            path("run_limits_max"),
            "a ceiling bounds amounts (tokens, usd, requests), not a window: set the window in run_limits_default",
        );
    }
    if raw.tenants[own].run_limits_default.is_some() || raw.tenants[own].run_limits_max.is_some() {
        if let Err(field) = RunLimits::resolve(None, &default, &max) {
            v.err(
                path("run_limits_default"),
                format!("`{field}` is above run_limits_max"),
            );
        }
    }
    let required = lineage
        .iter()
        .any(|&l| raw.tenants[l].run_required == Some(true));
    let runs_per_day = match raw.tenants[own].runs_per_day {
        Some(n) => v.positive(
            &path("runs_per_day"),
            Some(n),
            crate::config::bounds::MAX_QUOTA,
        ),
        None => lineage
            .iter()
            .find_map(|&l| raw.tenants[l].runs_per_day)
            .filter(|&n| n > 0)
            .map(|n| n as u64),
    };
    let ttl = match lineage
        .iter()
        .find_map(|&l| raw.tenants[l].run_ttl.as_ref().map(|t| (l, t)))
    {
        None => crate::config::run::DEFAULT_TTL,
        Some((l, t)) => match parse_ttl(t) {
            Ok(d) => d,
            Err(e) => {
                if l == own {
                    v.err(path("run_ttl"), format!("cannot be read: {e}"));
                }
                crate::config::run::DEFAULT_TTL
            }
        },
    };
    RunSettings {
        max,
        default,
        required,
        runs_per_day,
        ttl,
    }
}

/// Resolves `output_reservation`, `expected_quantile` and `max_exposure`
/// of tenant `i` (each its own, else its nearest ancestor's) and of its
/// keys (a key's mode, with the tenant's settings).
fn output_reservation(v: &mut V, raw: &RawConfig, i: usize, t: &mut TenantPolicy) {
    use crate::config::output_reservation::{
        parse_exposure, parse_mode, parse_quantile, ExpectedSettings,
    };
    let lineage: Vec<usize> = std::iter::once(i)
        .chain(t.ancestors.iter().copied())
        .collect();
    let mut settings = ExpectedSettings::default();
    if let Some((l, q)) = lineage
        .iter()
        .find_map(|&l| Some((l, raw.tenants[l].expected_quantile?)))
    {
        match parse_quantile(q) {
            Some(q) => settings.quantile_permille = q,
            None => v.err(
                format!("tenants[{l}].expected_quantile"),
                format!("must be within (0, 1], not {q}"),
            ),
        }
    }
    if let Some((l, m)) = lineage
        .iter()
        .find_map(|&l| Some((l, raw.tenants[l].max_exposure.as_ref()?)))
    {
        match parse_exposure(m) {
            Some(m) => settings.max_exposure = m,
            None => v.err(
                format!("tenants[{l}].max_exposure"),
                format!("must be a token count or \"N%\" (0 to 100), not {m}"),
            ),
        }
    }
    // Unset: cap mode, whose uncapped requests use `max_exposure` too.
    t.output_reservation = OutputReservation::Cap(settings.max_exposure);
    let mode = |s: &str| {
        parse_mode(s).map(|expected| match expected {
            true => OutputReservation::Expected(settings),
            false => OutputReservation::Cap(settings.max_exposure),
        })
    };
    if let Some((l, m)) = lineage
        .iter()
        .find_map(|&l| Some((l, raw.tenants[l].output_reservation.as_deref()?)))
    {
        match mode(m) {
            Some(m) => t.output_reservation = m,
            None => v.err(
                format!("tenants[{l}].output_reservation"),
                format!("must be \"expected\" or \"cap\", not {m:?}"),
            ),
        }
    }
    for (j, k) in raw.tenants[i].keys.iter().enumerate() {
        if let (Some(m), Some(kp)) = (k.output_reservation.as_deref(), t.keys.get_mut(j)) {
            kp.output_reservation = mode(m);
            if kp.output_reservation.is_none() {
                v.err(
                    format!("tenants[{i}].keys[{j}].output_reservation"),
                    format!("must be \"expected\" or \"cap\", not {m:?}"),
                );
            }
        }
    }
}

/// A digest's entry: refused from the earlier of the key's expiry and the
/// secret's own end.
fn key_ref(tenant: usize, key: usize, expires: Option<u64>, retires: Option<u64>) -> KeyRef {
    KeyRef {
        tenant,
        key,
        not_after: expires.unwrap_or(u64::MAX).min(retires.unwrap_or(u64::MAX)),
    }
}
