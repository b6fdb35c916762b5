//! The gateway configs of the scenarios, as TOML text (the shapes of
//! `tests/it/redis_fleet.rs`, `lease_fleet.rs`, `expected_output.rs`):
//! one self-hosted deployment `mock` on the mock upstream that forwards the
//! `x-mock-tenant` header and presents the key `mock`; every tenant
//! `fail_closed` unless a scenario says otherwise; a Redis store's timeout
//! [`STORE_TIMEOUT_MS`] (with 50 ms a burst on 2 cores falls back
//! to the local limiter).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::procs::DEPLOYMENT_KEY_ENV;

/// Where budgets live.
#[derive(Clone, Debug)]
pub enum Store {
    Memory,
    Redis {
        url: String,
        prefix: String,
        lease: Lease,
        fleet: usize,
        timeout_ms: u64,
    },
}

/// Quota leases of the Redis store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lease {
    Off,
    /// `mode = "auto"`, leased from 10 requests a second, a 100 ms report
    /// interval and half the capacity per lease, so that a burst of a
    /// second or two is decided by leases.
    On,
}

impl Lease {
    pub fn name(self) -> &'static str {
        match self {
            Lease::Off => "leases off",
            Lease::On => "leases on",
        }
    }
}

/// The Redis store's timeout in every scenario but `fail_open`: the
/// benchmark's rules ask at least 2 s; a debug gateway on 2 busy cores answering a
/// 900-request burst alone passed 2 s (its store calls queue behind the
/// burst), so 5 s.
pub const STORE_TIMEOUT_MS: u64 = 5000;

/// The lease settings of [`Lease::On`] (the bound's terms use them).
pub const LEASE_MAX_FRACTION: f64 = 0.5;

/// A tenant: its name (also its key and the mock's tenant label), its
/// limits as an inline TOML table, and extra lines.
#[derive(Clone, Debug)]
pub struct Tenant {
    pub name: String,
    pub limits: String,
    pub extra: Vec<String>,
}

impl Tenant {
    pub fn new(name: &str, limits: &str) -> Tenant {
        Tenant {
            name: name.into(),
            limits: limits.into(),
            extra: vec!["on_store_error = \"fail_closed\"".into()],
        }
    }

    pub fn with(mut self, line: &str) -> Tenant {
        if line.starts_with("on_store_error") {
            self.extra.retain(|l| !l.starts_with("on_store_error"));
        }
        self.extra.push(line.into());
        self
    }

    /// The tenant's API key.
    pub fn key(&self) -> String {
        key_of(&self.name)
    }
}

pub fn key_of(tenant: &str) -> String {
    format!("sk-accuracy-{tenant}")
}

/// A whole gateway config.
#[derive(Clone, Debug)]
pub struct Setup {
    pub store: Store,
    pub mock_url: String,
    pub step: u64,
    pub fallback_share: Option<f64>,
    /// Extra `[[models]]`/`[[upstreams]]` tables.
    pub extra_tables: Vec<String>,
    /// The chat model's extra lines (price, `client_cap_reservation`).
    pub chat_model: Vec<String>,
    /// Extra `[store]` lines (`layout = "tenant"`).
    pub store_lines: Vec<String>,
    /// The `mock` deployment's `limits` (an inline TOML table).
    pub upstream_limits: Option<String>,
    pub tenants: Vec<Tenant>,
}

impl Setup {
    pub fn new(store: Store, mock_url: &str) -> Setup {
        Setup {
            store,
            mock_url: mock_url.into(),
            step: 256,
            fallback_share: None,
            extra_tables: Vec::new(),
            chat_model: Vec::new(),
            store_lines: Vec::new(),
            upstream_limits: None,
            tenants: Vec::new(),
        }
    }

    pub fn render(&self) -> String {
        let mut s = String::from("[server]\nlisten = \"127.0.0.1:0\"\n\n[store]\n");
        match &self.store {
            Store::Memory => s.push_str("kind = \"memory\"\n"),
            Store::Redis {
                url,
                prefix,
                lease,
                fleet,
                timeout_ms,
            } => {
                let _ = writeln!(
                    s,
                    "kind = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"{prefix}\"\ntimeout_ms = {timeout_ms}"
                );
                if let Some(f) = self.fallback_share {
                    let _ = writeln!(s, "fallback_share = {f}");
                }
                for l in &self.store_lines {
                    let _ = writeln!(s, "{l}");
                }
                let _ = writeln!(s, "\n[store.lease]\nfleet_size = {fleet}");
                match lease {
                    Lease::Off => s.push_str("mode = \"off\"\n"),
                    Lease::On => {
                        let _ = writeln!(
                            s,
                            "mode = \"auto\"\nmin_rate = 10\nreport_interval_ms = 100\nmax_fraction = {LEASE_MAX_FRACTION}"
                        );
                    }
                }
            }
        }
        let _ = writeln!(s, "\n[estimation]\nstream_extension_step = {}\n", self.step);
        let _ = writeln!(
            s,
            "[[upstreams]]\nname = \"mock\"\nkind = \"self_hosted\"\nbase_url = \"{}\"\napi_key_env = \"{DEPLOYMENT_KEY_ENV}\"\nforward_client_headers = [\"x-mock-tenant\"]",
            self.mock_url
        );
        if let Some(l) = &self.upstream_limits {
            let _ = writeln!(s, "limits = {l}");
        }
        s.push('\n');
        let _ = writeln!(
            s,
            "[[models]]\nname = \"gpt-4o-mini\"\nupstreams = [\"mock\"]\nencoding = \"o200k_base\"\ndefault_max_output_tokens = 64\nmax_output_tokens = 4096"
        );
        for l in &self.chat_model {
            let _ = writeln!(s, "{l}");
        }
        s.push('\n');
        for t in &self.extra_tables {
            let _ = writeln!(s, "{t}\n");
        }
        for t in &self.tenants {
            let _ = writeln!(
                s,
                "[[tenants]]\nname = \"{}\"\nkeys = [{{ id = \"k\", sha256 = \"{}\" }}]\nlimits = {}",
                t.name,
                budgetgate::config::hash_key(&t.key()),
                t.limits
            );
            for l in &t.extra {
                let _ = writeln!(s, "{l}");
            }
            s.push('\n');
        }
        s
    }

    /// Writes the config into `dir` (by rename, so that a watching
    /// gateway never reads half a file) and returns its path.
    pub fn write(&self, dir: &Path) -> Result<PathBuf, String> {
        let path = dir.join("budgetgate.toml");
        let tmp = dir.join("budgetgate.toml.tmp");
        std::fs::write(&tmp, self.render()).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, &path).map_err(|e| e.to_string())?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use budgetgate::budget::placement::Layout;
    use budgetgate::config::Policy;

    #[test]
    fn store_lines_and_deployment_limits_render_where_the_gateway_reads_them() {
        std::env::set_var(DEPLOYMENT_KEY_ENV, "mock");
        let mut setup = Setup::new(
            Store::Redis {
                url: "redis+cluster://127.0.0.1:7000,127.0.0.1:7001".into(),
                prefix: "acc".into(),
                lease: Lease::Off,
                fleet: 3,
                timeout_ms: STORE_TIMEOUT_MS,
            },
            "http://127.0.0.1:9/v1",
        );
        setup.store_lines.push("layout = \"tenant\"".into());
        setup.upstream_limits = Some("{ rpm = 150, tpm = 12000 }".into());
        setup.tenants.push(Tenant::new("t00", "{ rpm = 30 }"));
        let policy = match Policy::from_toml(&setup.render()) {
            Ok(p) => p,
            Err(e) => panic!("{e}\n{}", setup.render()),
        };
        assert_eq!(policy.store.layout, Layout::Tenant);
        assert!(policy.placement.is_some());
        let mock = &policy.upstreams[0];
        assert_eq!((mock.limits.rpm, mock.limits.tpm), (Some(150), Some(12000)));
    }
}
