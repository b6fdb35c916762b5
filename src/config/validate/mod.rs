//! Validation of a whole config file into a [`Policy`]: every error
//! collected with its path. The sections with lists live in their own
//! modules: [`deployments`] (upstreams and models), [`tenants`].

mod alerts;
mod deployments;
pub mod forwarding;
mod ledger;
mod prices;
mod queue;
mod quota_lease;
mod telemetry;
mod tenants;
mod tree;
mod vertex;

use std::net::SocketAddr;
use std::time::Duration;

use super::bounds::{MAX_LIMIT, MAX_QUOTA};
use super::estimate::{EstimateSettings, ImageCost};
use super::ids::{is_valid_id, is_valid_prefix};
use super::placement::{DomainMap, Layout};
use super::raw::{RawConfig, RawLimits};
use super::*;

/// `[A-Za-z_][A-Za-z0-9_]*`: a portable environment variable name.
fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

pub(super) struct V {
    errors: Vec<String>,
}

impl V {
    fn err(&mut self, path: impl std::fmt::Display, msg: impl std::fmt::Display) {
        self.errors.push(format!("{path}: {msg}"));
    }

    fn positive(&mut self, path: &str, v: Option<i64>, max: u64) -> Option<u64> {
        match v {
            None => None,
            Some(x) if x <= 0 => {
                self.err(path, "must be > 0");
                None
            }
            Some(x) if x as u64 > max => {
                self.err(path, format!("must be ≤ {max}"));
                None
            }
            Some(x) => Some(x as u64),
        }
    }

    fn secs(&mut self, path: &str, v: Option<i64>, default: u64) -> Duration {
        Duration::from_secs(self.positive(path, v, 86_400 * 31).unwrap_or(default))
    }

    fn limits(&mut self, path: &str, l: &RawLimits) -> Limits {
        let p = |f: &str| format!("{path}.{f}");
        let out = Limits {
            rpm: self.positive(&p("rpm"), l.rpm, MAX_LIMIT),
            tpm: self.positive(&p("tpm"), l.tpm, MAX_LIMIT),
            rpm_burst: self.positive(&p("rpm_burst"), l.rpm_burst, MAX_LIMIT),
            tpm_burst: self.positive(&p("tpm_burst"), l.tpm_burst, MAX_LIMIT),
            input_tpm: self.positive(&p("input_tpm"), l.input_tpm, MAX_LIMIT),
            input_tpm_burst: self.positive(&p("input_tpm_burst"), l.input_tpm_burst, MAX_LIMIT),
            output_tpm: self.positive(&p("output_tpm"), l.output_tpm, MAX_LIMIT),
            output_tpm_burst: self.positive(&p("output_tpm_burst"), l.output_tpm_burst, MAX_LIMIT),
            max_concurrent: self.positive(&p("max_concurrent"), l.max_concurrent, 1_000_000),
            tokens_per_day: self.positive(&p("tokens_per_day"), l.tokens_per_day, MAX_QUOTA),
            tokens_per_month: self.positive(&p("tokens_per_month"), l.tokens_per_month, MAX_QUOTA),
            requests_per_day: self.positive(&p("requests_per_day"), l.requests_per_day, MAX_QUOTA),
            cache_read_weight: match l.cache_read_weight {
                None => None,
                Some(w) if (0..=1000).contains(&w) => Some(w as u64),
                Some(_) => {
                    self.err(
                        p("cache_read_weight"),
                        "must be within 0..=1000 (per mille of each cached input token)",
                    );
                    None
                }
            },
            usd_per_day: self.usd_budget(&p("usd_per_day"), l.usd_per_day.as_ref()),
            usd_per_month: self.usd_budget(&p("usd_per_month"), l.usd_per_month.as_ref()),
            tokens_per_5h: self.positive(&p("tokens_per_5h"), l.tokens_per_5h, MAX_QUOTA),
            tokens_per_24h: self.positive(&p("tokens_per_24h"), l.tokens_per_24h, MAX_QUOTA),
            tokens_per_week: self.positive(&p("tokens_per_week"), l.tokens_per_week, MAX_QUOTA),
            usd_per_5h: self.usd_budget(&p("usd_per_5h"), l.usd_per_5h.as_ref()),
            usd_per_24h: self.usd_budget(&p("usd_per_24h"), l.usd_per_24h.as_ref()),
            usd_per_week: self.usd_budget(&p("usd_per_week"), l.usd_per_week.as_ref()),
            from_first_use: match l.window.as_deref() {
                None | Some("rolling") => false,
                Some("from_first_use") => true,
                Some(other) => {
                    self.err(
                        p("window"),
                        format!("{other:?}: must be \"rolling\" or \"from_first_use\""),
                    );
                    false
                }
            },
        };
        if out.from_first_use
            && [
                out.tokens_per_5h,
                out.tokens_per_24h,
                out.tokens_per_week,
                out.usd_per_5h,
                out.usd_per_24h,
                out.usd_per_week,
            ]
            .iter()
            .all(Option::is_none)
        {
            self.err(
                p("window"),
                "\"from_first_use\" applies to tokens_per_5h, _24h, _week and usd_per_5h, _24h, _week: set one",
            );
        }
        for (burst, set, limit, limit_set) in [
            ("rpm_burst", out.rpm_burst, "rpm", l.rpm),
            ("tpm_burst", out.tpm_burst, "tpm", l.tpm),
            (
                "input_tpm_burst",
                out.input_tpm_burst,
                "input_tpm",
                l.input_tpm,
            ),
            (
                "output_tpm_burst",
                out.output_tpm_burst,
                "output_tpm",
                l.output_tpm,
            ),
        ] {
            if set.is_some() && limit_set.is_none() {
                self.err(p(burst), format!("needs {limit}"));
            }
        }
        out
    }
}

pub(super) fn validate(raw: RawConfig, version: String) -> Result<Policy, ConfigErrors> {
    let mut v = V { errors: Vec::new() };

    let listen_text = raw
        .server
        .listen
        .clone()
        .unwrap_or_else(|| "127.0.0.1:8080".into());
    let listen = match listen_text.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            v.err(
                "server.listen",
                format!("not a socket address: {listen_text:?}"),
            );
            SocketAddr::from(([127, 0, 0, 1], 8080))
        }
    };
    let mut renamed_keys = Vec::new();
    let slot_lease_secs = renamed(
        &mut v,
        &mut renamed_keys,
        ("server.slot_lease_secs", raw.server.slot_lease_secs),
        ("server.lease_secs", raw.server.lease_secs),
    );
    let server = ServerPolicy {
        listen,
        max_body_bytes: v
            .positive(
                "server.max_body_bytes",
                raw.server.max_body_bytes,
                256 << 20,
            )
            .unwrap_or(4 << 20) as usize,
        max_request: v.secs("server.max_request_secs", raw.server.max_request_secs, 600),
        slot_lease: v.secs("server.slot_lease_secs", slot_lease_secs, 30),
        settle_retry: v.secs(
            "server.settle_retry_secs",
            raw.server.settle_retry_secs,
            300,
        ),
        concurrency_retry: v.secs(
            "server.concurrency_retry_secs",
            raw.server.concurrency_retry_secs,
            1,
        ),
        admin_token_env: match raw.server.admin_token_env.as_deref() {
            None => "BUDGETGATE_ADMIN_TOKEN".into(),
            Some(name) if is_env_name(name) => name.to_string(),
            Some(name) => {
                v.err(
                    "server.admin_token_env",
                    format!("not an environment variable name: {name:?}"),
                );
                "BUDGETGATE_ADMIN_TOKEN".into()
            }
        },
        shutdown_grace: match raw.server.shutdown_grace_secs {
            None => Duration::from_secs(30),
            Some(s) if (0..=3600).contains(&s) => Duration::from_secs(s as u64),
            Some(_) => {
                v.err("server.shutdown_grace_secs", "must be within 0..=3600");
                Duration::from_secs(30)
            }
        },
        tls: super::tls::TlsFiles::validate(raw.server.tls.as_ref(), |p, m| v.err(p, m)),
        end_user_key_env: match raw.server.end_user_key_env.as_deref() {
            None => "BUDGETGATE_END_USER_KEY".into(),
            Some(name) if is_env_name(name) => name.to_string(),
            Some(name) => {
                v.err(
                    "server.end_user_key_env",
                    format!("not an environment variable name: {name:?}"),
                );
                "BUDGETGATE_END_USER_KEY".into()
            }
        },
        connections: super::ConnectionLimits {
            header_read_timeout: v.secs(
                "server.header_read_timeout_secs",
                raw.server.header_read_timeout_secs,
                30,
            ),
            write_timeout: v.secs(
                "server.write_timeout_secs",
                raw.server.write_timeout_secs,
                30,
            ),
            max_connections: v
                .positive(
                    "server.max_connections",
                    raw.server.max_connections,
                    10_000_000,
                )
                .map(|n| n as usize),
        },
    };

    let kind = match raw.store.kind.as_deref().unwrap_or("memory") {
        "memory" => StoreKind::Memory,
        "redis" => match &raw.store.url {
            Some(url) => StoreKind::Redis { url: url.clone() },
            None => {
                v.err("store.url", "required when store.kind = \"redis\"");
                StoreKind::Memory
            }
        },
        other => {
            v.err(
                "store.kind",
                format!("must be \"memory\" or \"redis\", not {other:?}"),
            );
            StoreKind::Memory
        }
    };
    let key_prefix = raw
        .store
        .key_prefix
        .clone()
        .unwrap_or_else(|| "budgetgate".into());
    if !is_valid_prefix(&key_prefix) {
        v.err(
            "store.key_prefix",
            "must be 1-64 printable characters without '{', '}' or spaces",
        );
    }
    let domain = raw.store.domain.clone().unwrap_or_else(|| "default".into());
    if !is_valid_id(&domain) {
        v.err("store.domain", "must match [A-Za-z0-9._-]{1,64}");
    }
    let layout = match raw.store.layout.as_deref() {
        None | Some("single") => Layout::Single,
        Some("tenant") => Layout::Tenant,
        Some(other) => {
            v.err(
                "store.layout",
                format!("must be \"single\" or \"tenant\", not {other:?}"),
            );
            Layout::Single
        }
    };
    let lease = quota_lease::lease(&mut v, &raw, &kind);
    let store = StorePolicy {
        layout,
        lease,
        kind,
        timeout: Duration::from_millis(
            v.positive("store.timeout_ms", raw.store.timeout_ms, 60_000)
                .unwrap_or(50),
        ),
        key_prefix,
        domain,
        fallback_share: match raw.store.fallback_share {
            None => 1.0,
            Some(f) if f > 0.0 && f <= 1.0 => f,
            Some(_) => {
                v.err("store.fallback_share", "must be within (0, 1]");
                1.0
            }
        },
        snapshot_path: match raw.store.snapshot_path.as_deref() {
            None => None,
            Some("") => {
                v.err("store.snapshot_path", "must not be empty");
                None
            }
            Some(p) => Some(p.into()),
        },
        record_ttl: Duration::from_secs(
            v.positive(
                "store.response_record_ttl_secs",
                raw.store.response_record_ttl_secs,
                10 * 365 * 86_400,
            )
            .unwrap_or(super::store::DEFAULT_RECORD_TTL.as_secs()),
        ),
        max_memory_records: v
            .positive(
                "store.max_response_records",
                raw.store.max_response_records,
                100_000_000,
            )
            .map_or(super::store::DEFAULT_MAX_MEMORY_RECORDS, |n| n as usize),
        deny_cache_entries: v
            .positive(
                "store.deny_cache_entries",
                raw.store.deny_cache_entries,
                100_000_000,
            )
            .map_or(super::store::DEFAULT_DENY_CACHE_ENTRIES, |n| n as usize),
        fail_open_entries: v
            .positive(
                "store.fail_open_entries",
                raw.store.fail_open_entries,
                100_000_000,
            )
            .map_or(super::store::DEFAULT_FAIL_OPEN_ENTRIES, |n| n as usize),
    };

    let e = &raw.estimation;
    let defaults = EstimateSettings::default();
    let estimation = EstimateSettings {
        image_part_tokens: v
            .positive(
                "estimation.image_part_tokens",
                e.image_part_tokens,
                MAX_LIMIT,
            )
            .unwrap_or(defaults.image_part_tokens),
        image_tokens: image_tokens(&mut v, e.image_tokens.as_ref()),
        audio_part_tokens: v
            .positive(
                "estimation.audio_part_tokens",
                e.audio_part_tokens,
                MAX_LIMIT,
            )
            .unwrap_or(defaults.audio_part_tokens),
        structured_margin_percent: match e.structured_margin_percent {
            Some(p) if !(0..=1000).contains(&p) => {
                v.err(
                    "estimation.structured_margin_percent",
                    "must be within 0..=1000",
                );
                defaults.structured_margin_percent
            }
            Some(p) => p as u64,
            None => defaults.structured_margin_percent,
        },
        structured_margin_tokens: match e.structured_margin_tokens {
            Some(p) if !(0..=1_000_000).contains(&p) => {
                v.err(
                    "estimation.structured_margin_tokens",
                    "must be within 0..=1000000",
                );
                defaults.structured_margin_tokens
            }
            Some(p) => p as u64,
            None => defaults.structured_margin_tokens,
        },
    };
    let min_output_tokens = v
        .positive(
            "estimation.min_output_tokens",
            e.min_output_tokens,
            MAX_LIMIT,
        )
        .unwrap_or(16);
    // At most a million tokens: a dollar budget's partial grant is then
    // computed without a product above 2^53 (src/money/mod.rs).
    let stream_extension_step = v
        .positive(
            "estimation.stream_extension_step",
            e.stream_extension_step,
            crate::money::PRICE_TOKENS,
        )
        .unwrap_or(256);
    let stream_counting = match e.stream_counting.as_deref() {
        None | Some("bound") => super::estimate::StreamCounting::Bound,
        Some("exact") => super::estimate::StreamCounting::Exact,
        Some(other) => {
            v.err(
                "estimation.stream_counting",
                format!("must be bound or exact, not {other:?}"),
            );
            super::estimate::StreamCounting::Bound
        }
    };

    let (upstreams, upstream_index) = deployments::upstreams(&mut v, &raw, &server);
    let (models, model_index) =
        deployments::models(&mut v, &raw, &upstream_index, &upstreams, &estimation);
    let (tenants, key_index) = tenants::tenants(&mut v, &raw, &model_index);
    // Recomputed with every policy (a reload may add tenants and models),
    // outside `[store]`, which is bound at start.
    let placement = (store.layout == Layout::Tenant)
        .then(|| std::sync::Arc::new(domain_map(&store.domain, &tenants, &upstreams, &models)));
    let end_user_key = end_user_key(&mut v, &server, &tenants);
    let queue = queue::queue(&mut v, raw.queue.as_ref(), &server);
    let ledger = ledger::ledger(&mut v, &raw.ledger);
    let alerts = alerts::alerts(&mut v, &raw.alerts);
    let telemetry = telemetry::telemetry(&mut v, &raw.telemetry);
    for m in models.iter().filter(|m| m.responses) {
        if min_output_tokens < super::bounds::RESPONSES_MIN_CAP {
            v.err(
                "estimation.min_output_tokens",
                format!(
                    "must be at least {} while model {:?} is served on /v1/responses (the API refuses a smaller max_output_tokens); raise it or set responses = false on the model",
                    super::bounds::RESPONSES_MIN_CAP,
                    m.name
                ),
            );
        }
    }
    let control = ControlPolicy {
        database_url: match raw.control.database_url.as_deref() {
            // The URL itself is not repeated: it may hold a password.
            Some(url) if crate::db::DbKind::of(url).is_none() => {
                v.err(
                    "control.database_url",
                    "must start with sqlite: or postgres:// (postgresql://)",
                );
                None
            }
            url => url.map(str::to_string),
        },
    };
    if !v.errors.is_empty() {
        return Err(ConfigErrors(v.errors));
    }
    Ok(Policy {
        placement,
        control,
        version,
        server,
        store,
        estimation,
        min_output_tokens,
        stream_extension_step,
        stream_counting,
        upstreams,
        models,
        tenants,
        end_user_key,
        queue,
        ledger,
        alerts,
        telemetry,
        renamed_keys,
        model_index,
        key_index,
    })
}

/// The `tenant` layout's placement input: each tenant's top-level tenant
/// (its farthest ancestor), each model's deployment budget scopes.
pub(super) fn domain_map(
    domain: &str,
    tenants: &[super::TenantPolicy],
    upstreams: &[super::UpstreamPolicy],
    models: &[super::ModelPolicy],
) -> DomainMap {
    DomainMap::new(
        domain,
        tenants.iter().map(|t| {
            let root = t
                .ancestors
                .last()
                .and_then(|&i| tenants.get(i))
                .unwrap_or(t);
            (t.name.as_str(), root.name.as_str())
        }),
        models.iter().map(|m| {
            m.upstreams
                .iter()
                .filter_map(|&i| upstreams.get(i).map(|u| u.budget_scope()))
                .collect()
        }),
    )
}

/// A setting that has a new name and a former one (accepted for one
/// release): the value under either, a note naming the new key when the
/// former is used, an error when both are.
fn renamed<T>(
    v: &mut V,
    notes: &mut Vec<String>,
    (new, new_value): (&str, Option<T>),
    (old, old_value): (&str, Option<T>),
) -> Option<T> {
    match (new_value, old_value) {
        (Some(n), Some(_)) => {
            v.err(old, format!("is the former name of {new}: set only {new}"));
            Some(n)
        }
        (None, Some(o)) => {
            notes.push(format!(
                "{old} is renamed {new}: the former name is accepted until the next release"
            ));
            Some(o)
        }
        (n, None) => n,
    }
}

/// The end-user hash key from `server.end_user_key_env`: required (at
/// least [`super::end_user::MIN_KEY_BYTES`] bytes) when a tenant has
/// end-user settings; read when set anyway (a shorter value is then
/// unused: no tenant hashes with it).
fn end_user_key(
    v: &mut V,
    server: &ServerPolicy,
    tenants: &[TenantPolicy],
) -> Option<std::sync::Arc<super::end_user::EndUserKey>> {
    use super::end_user::{EndUserKey, MIN_KEY_BYTES};
    let var = &server.end_user_key_env;
    let needed_by = tenants
        .iter()
        .position(|t| t.end_user_required || !t.end_user_limits.is_empty());
    match (std::env::var_os(var), needed_by) {
        (Some(k), _) if k.len() >= MIN_KEY_BYTES => {
            Some(std::sync::Arc::new(EndUserKey::new(k.as_encoded_bytes())))
        }
        (_, Some(i)) => {
            v.err(
                "server.end_user_key_env",
                format!(
                    "environment variable {var} must hold a secret of at least {MIN_KEY_BYTES} bytes: tenants[{i}] has end-user settings, whose ids are hashed with it"
                ),
            );
            None
        }
        (_, None) => None,
    }
}

/// `[estimation.image_tokens]`: `prefix = { low, high }`, `low` defaulting
/// to `high`; prefixes compared in lower case.
fn image_tokens(
    v: &mut V,
    table: Option<&std::collections::BTreeMap<String, super::raw::RawImageTokens>>,
) -> Vec<(String, ImageCost)> {
    let mut out = Vec::new();
    for (prefix, cost) in table.into_iter().flatten() {
        let path = format!("estimation.image_tokens.{prefix:?}");
        if prefix.is_empty() {
            v.err(&path, "the model-name prefix must not be empty");
            continue;
        }
        let Some(high) = v.positive(&format!("{path}.high"), cost.high, MAX_LIMIT) else {
            if cost.high.is_none() {
                v.err(
                    &path,
                    "needs `high` (tokens of a high-detail or auto image)",
                );
            }
            continue;
        };
        let low = v
            .positive(&format!("{path}.low"), cost.low, MAX_LIMIT)
            .unwrap_or(high);
        out.push((prefix.to_ascii_lowercase(), ImageCost { low, high }));
    }
    out
}
