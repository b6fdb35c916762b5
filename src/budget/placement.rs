//! Where a budget lives: the placement rule of the `tenant` key layout
//! (DESIGN section 22, OPERATIONS "Key layout"), one pure function of a
//! scope and the policy's tenant tree and deployment groups.
//!
//! - `single` layout: every key carries the fleet's one hash tag
//!   `{<store.domain>}` (one Redis Cluster slot).
//! - `tenant` layout: every key of a top-level tenant's tree (its own
//!   tenants, keys, end users and tenant × model budgets: every scope that
//!   names a tenant) carries `{<store.domain>.t.<top-level tenant>}`; every
//!   deployment budget carries `{<store.domain>.d.<group>}`, where a group
//!   is the deployments that serve a common model, closed over shared
//!   models (a deployment serving models A and B joins A's and B's
//!   deployments in one group), named by its smallest deployment budget
//!   scope. The candidates of one model are then in one domain, so choosing
//!   among them stays one script call, and the weighted-fair share key of a
//!   deployment (its budget key's stem) lies beside them.
//!
//! The rule is keyed by scope, not by budget name: any budget later nested
//! under a tenant (a run budget, a rolling window) lands in its tree's domain.

use super::keys::encode_name;
use super::Scope;

pub use crate::config::placement::{DomainMap, Layout};

/// The placement rule: the hash tag (without braces) of every key of
/// `scope` under `layout`; `map` is read only by the `tenant` layout.
pub fn hash_tag(layout: Layout, domain: &str, map: Option<&DomainMap>, scope: &Scope) -> String {
    let Some(map) = map.filter(|_| layout == Layout::Tenant) else {
        return domain.to_string();
    };
    match scope {
        Scope::Tenant(t)
        | Scope::Key(t, _)
        | Scope::TenantModel(t, _)
        | Scope::EndUser(t, _)
        | Scope::Run(t, _) => tenant_tag(domain, map.root_of(t)),
        Scope::Upstream(u) => deployment_tag(domain, map.group_of(u)),
    }
}

/// The tag of top-level tenant `root`'s tree (tenant ids are
/// `[A-Za-z0-9._-]`: no escaping needed).
pub fn tenant_tag(domain: &str, root: &str) -> String {
    format!("{domain}.t.{root}")
}

/// The tag of deployment group `group` (percent-encoded: a deployment
/// name may hold `/`, `:` or braces).
pub fn deployment_tag(domain: &str, group: &str) -> String {
    format!("{domain}.d.{}", encode_name(group))
}

/// Index of the version digit in a hyphenated UUID
/// (`xxxxxxxx-xxxx-Vxxx-…`).
const VERSION_DIGIT: usize = 14;

/// The layout a reservation id was made in. Gateway-made ids are UUIDs:
/// the `single` layout's are version 7 (as every release before the
/// `tenant` layout made them), the `tenant` layout's carry version 8 (the
/// same time-ordered bits, version digit `8`), so any gateway, restarted or
/// not, of either layout, reads from the id alone where its holds were
/// made. Any other id (a tool's, a test's) reads as `single`: the layout of
/// every id made before the mark existed.
pub fn layout_of_reservation(id: &str) -> Layout {
    let b = id.as_bytes();
    let marked =
        b.len() == 36 && b[VERSION_DIGIT] == b'8' && [8, 13, 18, 23].iter().all(|&i| b[i] == b'-');
    if marked {
        Layout::Tenant
    } else {
        Layout::Single
    }
}

/// `id` (a UUID's 16 bytes) marked as made in `layout`: version 8 for the
/// `tenant` layout, unchanged for `single`.
pub fn mark_reservation(mut id: [u8; 16], layout: Layout) -> [u8; 16] {
    if layout == Layout::Tenant {
        id[6] = (id[6] & 0x0F) | 0x80;
    }
    id
}

/// How `names` (top-level tenants) spread over a cluster of `primaries`
/// primaries holding equal slot ranges (as `redis-cli --cluster create`
/// assigns them): distinct slots, and tenants per primary.
pub fn spread<'a>(
    domain: &str,
    names: impl IntoIterator<Item = &'a str>,
    primaries: usize,
) -> (usize, Vec<usize>) {
    let primaries = primaries.max(1);
    let mut slots = std::collections::BTreeSet::new();
    let mut per = vec![0usize; primaries];
    for n in names {
        let slot = usize::from(slot_of_tag(&tenant_tag(domain, n)));
        slots.insert(slot);
        // Primary i's range starts at round(16384·i/p) (0–5460, 5461–10922,
        // 10923–16383 for three, as `redis-cli --cluster create` splits).
        let i = (1..primaries)
            .filter(|&i| slot >= ((i * 16384) as f64 / primaries as f64).round() as usize)
            .count();
        per[i] += 1;
    }
    (slots.len(), per)
}

/// The Redis Cluster slot of hash tag `tag` (CRC16/XMODEM mod 16384): for
/// the spread OPERATIONS prints, and for tests that place tenants.
pub fn slot_of_tag(tag: &str) -> u16 {
    let mut crc: u16 = 0;
    for &b in tag.as_bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> DomainMap {
        DomainMap::new(
            "fleet",
            [("team", "acme"), ("acme", "acme"), ("solo", "solo")],
            [
                vec!["oai-east", "oai-west"],
                vec!["oai-west", "azure/gpt"],
                vec!["claude"],
                vec!["zeta", "beta"],
            ],
        )
    }

    #[test]
    fn a_tenant_tree_shares_its_top_level_tenants_tag() {
        let m = map();
        let tag = |s: Scope| hash_tag(Layout::Tenant, "fleet", Some(&m), &s);
        let want = "fleet.t.acme";
        assert_eq!(tag(Scope::Tenant("acme".into())), want);
        assert_eq!(tag(Scope::Tenant("team".into())), want);
        assert_eq!(tag(Scope::Key("team".into(), "k".into())), want);
        assert_eq!(tag(Scope::TenantModel("team".into(), "m/x".into())), want);
        assert_eq!(tag(Scope::EndUser("team".into(), "ab".into())), want);
        assert_eq!(tag(Scope::Run("team".into(), "r:1".into())), want);
        assert_eq!(tag(Scope::Tenant("solo".into())), "fleet.t.solo");
        // A tenant the map does not know (added since) is its own root.
        assert_eq!(tag(Scope::Tenant("new".into())), "fleet.t.new");
    }

    #[test]
    fn deployments_sharing_a_model_share_a_group_named_by_the_smallest() {
        let m = map();
        let tag = |u: &str| {
            hash_tag(
                Layout::Tenant,
                "fleet",
                Some(&m),
                &Scope::Upstream(u.into()),
            )
        };
        // oai-east and oai-west share a model; oai-west and azure/gpt another.
        assert_eq!(tag("oai-east"), "fleet.d.azure%2Fgpt");
        assert_eq!(tag("oai-west"), "fleet.d.azure%2Fgpt");
        assert_eq!(tag("azure/gpt"), "fleet.d.azure%2Fgpt");
        assert_eq!(tag("claude"), "fleet.d.claude");
        assert_eq!(tag("zeta"), "fleet.d.beta");
        assert_eq!(tag("unlisted"), "fleet.d.unlisted");
    }

    #[test]
    fn the_single_layout_is_one_tag() {
        let m = map();
        for s in [
            Scope::Tenant("team".into()),
            Scope::Upstream("claude".into()),
        ] {
            assert_eq!(hash_tag(Layout::Single, "fleet", Some(&m), &s), "fleet");
            assert_eq!(hash_tag(Layout::Tenant, "fleet", None, &s), "fleet");
        }
    }

    /// Prints the spread OPERATIONS quotes ("Key layout"): 10, 100 and
    /// 10,000 tenant names over 3 primaries (`cargo test --lib
    /// placement::tests::slot_spread -- --nocapture`).
    #[test]
    fn slot_spread_of_tenant_names() {
        for n in [10usize, 100, 10_000] {
            let names: Vec<String> = (0..n)
                .map(|i| {
                    if n <= 1000 {
                        format!("t{i:03}")
                    } else {
                        format!("t{i:04}")
                    }
                })
                .collect();
            let (slots, per) = spread("default", names.iter().map(String::as_str), 3);
            let third = n as f64 / 3.0;
            let worst = per
                .iter()
                .map(|&c| (c as f64 - third).abs() / third * 100.0)
                .fold(0.0, f64::max);
            println!(
                "{n} tenants: {slots} distinct slots; per primary {per:?}; largest deviation from a third {worst:.1} %"
            );
            assert_eq!(per.iter().sum::<usize>(), n);
            if n >= 10_000 {
                assert!(worst < 5.0, "10,000 names spread unevenly: {per:?}");
            }
        }
    }

    #[test]
    fn a_reservation_id_says_its_layout() {
        let v7 = uuid::Uuid::now_v7();
        let single = uuid::Uuid::from_bytes(mark_reservation(*v7.as_bytes(), Layout::Single));
        let tenant = uuid::Uuid::from_bytes(mark_reservation(*v7.as_bytes(), Layout::Tenant));
        assert_eq!(single, v7);
        assert_eq!(tenant.get_version_num(), 8);
        // The rest of the id is kept: still time-ordered, still unique.
        assert_eq!(tenant.as_bytes()[..6], v7.as_bytes()[..6]);
        assert_eq!(tenant.as_bytes()[7..], v7.as_bytes()[7..]);
        assert_eq!(
            layout_of_reservation(&tenant.hyphenated().to_string()),
            Layout::Tenant
        );
        for other in [
            v7.hyphenated().to_string(),
            uuid::Uuid::new_v4().hyphenated().to_string(),
            "r1".into(),
            "0192aaaa-bbbb-8ccc".into(),
            // Version digit 8 without a UUID's shape: a tool's id.
            "0192aaaabbbbb8cccdddd1eeeeeeeeeeeeee".into(),
        ] {
            assert_eq!(layout_of_reservation(&other), Layout::Single, "{other}");
        }
    }

    #[test]
    fn slots_as_redis_computes_them() {
        // Reference values of CLUSTER KEYSLOT.
        assert_eq!(slot_of_tag("123456789"), 12739);
        assert_eq!(slot_of_tag("foo"), 12182);
        assert_eq!(slot_of_tag(""), 0);
    }
}
