//! Stored key names: one pure function per kind of key (DESIGN section 3).
//!
//! Shape: `<prefix>:{<domain>}:v<version>:<kind>:<scope parts…>`. Every key
//! of one budget domain carries the same `{hash tag}`, so every key one
//! reservation touches lives on one Redis Cluster slot. The version suffix
//! changes whenever the stored layout or script semantics change, so a
//! rolling deploy never mixes script versions on the same state.
//!
//! Tenant and key ids are restricted to `[A-Za-z0-9._-]{1,64}`; model and
//! upstream names (which may contain `/` or `:`) are percent-encoded.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use std::sync::Arc;

use super::placement::{self, DomainMap, Layout};
use super::{BudgetName, Scope};

/// Version of the stored layout and script semantics.
pub const LAYOUT_VERSION: u32 = 3;

/// Characters left as they are in encoded names.
const NAME: &AsciiSet = &NON_ALPHANUMERIC.remove(b'.').remove(b'_').remove(b'-');

/// The Redis Cluster hash tag of `key`: what lies between its first `{`
/// and the next `}`, when that is not empty (the slot is then computed on
/// the tag alone).
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// Percent-encodes a model or upstream name for use inside a key.
pub fn encode_name(name: &str) -> String {
    utf8_percent_encode(name, NAME).to_string()
}

/// Key of the owner record of stored response `id` (not of a budget
/// domain): `<prefix>:{<id>}:v<LAYOUT_VERSION>:resp`. Its hash tag is the
/// response id, so records spread over a Redis Cluster instead of crowding
/// the budget domain's slot. `id` is `[A-Za-z0-9_-]{1,128}` (never a brace).
pub fn response_record(prefix: &str, id: &str) -> String {
    format!("{prefix}:{{{id}}}:v{LAYOUT_VERSION}:resp")
}

/// Names keys: within one budget domain (the `single` layout), or each
/// scope in the domain the placement rule gives it (the `tenant` layout,
/// [`placement`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpace {
    base: String,
    prefix: String,
    /// The `tenant` layout's tenant tree and deployment groups; `None`: one domain.
    placement: Option<Arc<DomainMap>>,
}

impl KeySpace {
    /// Key space `<prefix>:{<domain>}:v<LAYOUT_VERSION>`. `prefix` must satisfy
    /// [`is_valid_prefix`](crate::config::ids::is_valid_prefix) and `domain`
    /// [`is_valid_id`](crate::config::ids::is_valid_id) (checked at config load).
    pub fn new(prefix: &str, domain: &str) -> Self {
        Self {
            base: format!("{prefix}:{{{domain}}}:v{LAYOUT_VERSION}"),
            prefix: prefix.to_string(),
            placement: None,
        }
    }

    /// This key space under `layout`: budgets of the `tenant` layout are
    /// named in the domain `placement` gives their scope; holds and
    /// everything else stay as [`Self::new`] names them.
    pub fn with_layout(mut self, layout: Layout, placement: Option<Arc<DomainMap>>) -> Self {
        self.placement = placement.filter(|_| layout == Layout::Tenant);
        self
    }

    /// The key space of the domain tagged `tag` (same prefix, no placement):
    /// where the holds of budgets in that domain are named.
    pub fn in_domain(&self, tag: &str) -> KeySpace {
        KeySpace::new(&self.prefix, tag)
    }

    /// The layout this key space names budgets in.
    pub fn layout(&self) -> Layout {
        if self.placement.is_some() {
            Layout::Tenant
        } else {
            Layout::Single
        }
    }

    /// The key `key` (of this key space) had under the previous layout
    /// (`v<LAYOUT_VERSION − 1>`), where quota counters are still read from
    /// until the current layout has its own (a layout bump keeps quotas).
    pub fn previous_layout(&self, key: &str) -> Option<String> {
        let rest = key.strip_prefix(&self.base)?;
        // Built with itoa into one string sized once, not `format!`: the
        // Redis store asks this for every quota budget of every
        // reservation, where two `format!`s cost about 2,000 instructions.
        let (mut now, mut before) = (itoa::Buffer::new(), itoa::Buffer::new());
        let head = self
            .base
            .strip_suffix(now.format(LAYOUT_VERSION))?
            .strip_suffix(":v")?;
        let previous = before.format(LAYOUT_VERSION - 1);
        let mut out = String::with_capacity(head.len() + 2 + previous.len() + rest.len());
        out.push_str(head);
        out.push_str(":v");
        out.push_str(previous);
        out.push_str(rest);
        Some(out)
    }

    /// The shared prefix of every key, including the hash tag.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Key of one budget of one scope.
    pub fn budget(&self, scope: &Scope, name: BudgetName) -> String {
        self.of_scope(scope, name.as_str())
    }

    /// Key of the record of run `scope` ([`crate::budget::RunRecord`]):
    /// beside the run's budgets, in its tenant tree's domain.
    pub fn run_record(&self, scope: &Scope) -> String {
        self.of_scope(scope, "limits")
    }

    /// Key of tenant `tenant`'s index of active runs by tokens reserved (a
    /// sorted set; its companion `<key>:expiry` holds each run's record
    /// expiry): in the tenant tree's domain, as its runs' records.
    pub fn run_index(&self, tenant: &str) -> String {
        self.of_scope(&Scope::Tenant(tenant.into()), "runs")
    }

    /// `<base of the scope's domain>:<scope>:<n>`.
    fn of_scope(&self, scope: &Scope, n: &str) -> String {
        let placed;
        let b = match &self.placement {
            None => &self.base,
            Some(map) => {
                let tag = placement::hash_tag(Layout::Tenant, map.domain(), Some(map), scope);
                placed = format!("{}:{{{tag}}}:v{LAYOUT_VERSION}", self.prefix);
                &placed
            }
        };
        match scope {
            Scope::Tenant(t) => format!("{b}:tenant:{t}:{n}"),
            Scope::Key(t, k) => format!("{b}:key:{t}:{k}:{n}"),
            Scope::TenantModel(t, m) => format!("{b}:tenant_model:{t}:{}:{n}", encode_name(m)),
            Scope::Upstream(u) => format!("{b}:upstream:{}:{n}", encode_name(u)),
            // The hash is hex already; encoded anyway, so that no caller
            // can put a brace or a separator in a key through it.
            Scope::EndUser(t, h) => format!("{b}:end_user:{t}:{}:{n}", encode_name(h)),
            // Run ids are `[A-Za-z0-9._:-]`: the `:` is encoded.
            Scope::Run(t, r) => format!("{b}:run:{t}:{}:{n}", encode_name(r)),
        }
    }

    /// Key of a shadow budget (evaluated, never enforced) of one scope.
    pub fn shadow_budget(&self, scope: &Scope, name: BudgetName) -> String {
        format!("{}:shadow", self.budget(scope, name))
    }

    /// Key of the record of quota lease `lease` (gateway-made) of the budget
    /// stored at `budget_key` (a key of this key space: [`Self::budget`] or
    /// [`Self::shadow_budget`]): `<budget key>:lease:<encoded id>`. A lease
    /// is of one budget: the same id on two budgets names two records.
    pub fn lease(&self, budget_key: &str, lease: &str) -> String {
        format!("{budget_key}:lease:{}", encode_name(lease))
    }

    /// Key of the epoch record of the budget stored at `budget_key`: its
    /// policy epoch, the policy it was set under and its live quota leases
    /// (`lua/lease.lua`): `<budget key>:epoch`.
    pub fn budget_epoch(&self, budget_key: &str) -> String {
        format!("{budget_key}:epoch")
    }

    /// Key of the hold of one reservation id (ids are gateway-generated UUIDs).
    pub fn hold(&self, reservation_id: &str) -> String {
        // Built by hand: twice per request, and `format!` with the encoder
        // cost ~2k instructions each (callgrind). A UUID needs no escapes,
        // so the encoder's borrowed form is copied once.
        let id: std::borrow::Cow<str> = utf8_percent_encode(reservation_id, NAME).into();
        let mut key = String::with_capacity(self.base.len() + 6 + id.len());
        key.push_str(&self.base);
        key.push_str(":hold:");
        key.push_str(&id);
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_a_domain_shares_one_hash_tag() {
        let ks = KeySpace::new("bg", "default");
        let keys = [
            ks.budget(&Scope::Tenant("acme".into()), BudgetName::Tpm),
            ks.budget(&Scope::Key("acme".into(), "batch".into()), BudgetName::Rpm),
            ks.budget(
                &Scope::TenantModel("acme".into(), "meta/llama-3".into()),
                BudgetName::TokensPerDay,
            ),
            ks.budget(
                &Scope::Upstream("azure:east".into()),
                BudgetName::MaxConcurrent,
            ),
            ks.hold("0192-abc"),
        ];
        for k in &keys {
            let open = k.find('{').expect("hash tag");
            let close = k.find('}').expect("hash tag");
            assert_eq!(&k[open..=close], "{default}", "{k}");
            assert_eq!(k.matches('{').count(), 1, "{k}");
        }
        assert_eq!(keys[0], "bg:{default}:v3:tenant:acme:tpm");
        assert_eq!(
            keys[2],
            "bg:{default}:v3:tenant_model:acme:meta%2Fllama-3:tokens_per_day"
        );
        assert_eq!(
            keys[3],
            "bg:{default}:v3:upstream:azure%3Aeast:max_concurrent"
        );
    }

    #[test]
    fn lease_keys_extend_their_budget_key_and_keep_its_hash_tag() {
        let ks = KeySpace::new("bg", "d");
        let tpm = ks.budget(&Scope::Tenant("acme".into()), BudgetName::Tpm);
        assert_eq!(
            ks.lease(&tpm, "gw-1/7 #2"),
            "bg:{d}:v3:tenant:acme:tpm:lease:gw-1%2F7%20%232"
        );
        assert_eq!(ks.budget_epoch(&tpm), "bg:{d}:v3:tenant:acme:tpm:epoch");
        let shadow = ks.shadow_budget(&Scope::Tenant("acme".into()), BudgetName::Tpm);
        assert_ne!(ks.lease(&shadow, "x"), ks.lease(&tpm, "x"));
        assert_eq!(hash_tag(&ks.lease(&tpm, "}{")), Some("d"));
        assert_eq!(hash_tag(&ks.budget_epoch(&tpm)), Some("d"));
    }

    #[test]
    fn hash_tags_as_redis_cluster_reads_them() {
        assert_eq!(hash_tag("bg:{d}:v3:x"), Some("d"));
        assert_eq!(hash_tag("bg:{}:v3:{d}"), None);
        assert_eq!(hash_tag("bg:d"), None);
        let ks = KeySpace::new("bg", "d");
        let end_user = Scope::EndUser("acme".into(), "0f{}:\n".into());
        let k = ks.budget(&end_user, BudgetName::Tpm);
        assert_eq!(k, "bg:{d}:v3:end_user:acme:0f%7B%7D%3A%0A:tpm");
        assert_eq!(hash_tag(&k), Some("d"));
    }

    #[test]
    fn a_key_of_the_previous_layout_differs_in_its_version_only() {
        let ks = KeySpace::new("bg", "d:v3");
        let k = ks.budget(&Scope::Tenant("acme".into()), BudgetName::TokensPerDay);
        assert_eq!(k, "bg:{d:v3}:v3:tenant:acme:tokens_per_day");
        assert_eq!(
            ks.previous_layout(&k).as_deref(),
            Some("bg:{d:v3}:v2:tenant:acme:tokens_per_day")
        );
        assert_eq!(ks.previous_layout(&k.replace("{d:v3}", "{e}")), None);
    }

    #[test]
    fn run_keys_carry_their_tenants_tag_and_an_encoded_id() {
        let ks = KeySpace::new("bg", "d");
        let run = Scope::Run("acme".into(), "job:7".into());
        let k = ks.budget(&run, BudgetName::TokensPer24h);
        assert_eq!(k, "bg:{d}:v3:run:acme:job%3A7:tokens_per_24h");
        assert_eq!(ks.run_record(&run), "bg:{d}:v3:run:acme:job%3A7:limits");
        assert_eq!(hash_tag(&ks.run_record(&run)), Some("d"));
        assert_eq!(ks.run_index("acme"), "bg:{d}:v3:tenant:acme:runs");
    }

    #[test]
    fn names_cannot_smuggle_hash_tags_or_separators() {
        let ks = KeySpace::new("bg", "d");
        let k = ks.budget(&Scope::Upstream("x}{y:z".into()), BudgetName::Tpm);
        assert_eq!(k, "bg:{d}:v3:upstream:x%7D%7By%3Az:tpm");
    }
}
