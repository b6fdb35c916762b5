//! Validation of `[queue]` and of the `priority` / `weight` of tenants
//! and keys.

use std::time::Duration;

use super::V;
use crate::config::queue::{Class, QueuePolicy, WaitKind};
use crate::config::raw::RawQueue;
use crate::config::ServerPolicy;

/// Largest `weight`: tags stay far from overflow and a share of one in a
/// million is already below anything measurable.
const MAX_WEIGHT: u64 = 1_000_000;

/// A `priority` as written (`None` when absent or unknown, reported).
pub(super) fn class(v: &mut V, path: &str, s: Option<&str>) -> Option<Class> {
    let s = s?;
    let c = Class::parse(s);
    if c.is_none() {
        v.err(
            path,
            format!("unknown class {s:?} (one of \"interactive\", \"standard\", \"batch\")"),
        );
    }
    c
}

/// A `weight` as written.
pub(super) fn weight(v: &mut V, path: &str, w: Option<i64>) -> Option<u64> {
    v.positive(path, w, MAX_WEIGHT)
}

/// `[queue]`, checked against `server` (a wait longer than a request may
/// run could never end in an answer).
pub(super) fn queue(
    v: &mut V,
    raw: Option<&RawQueue>,
    server: &ServerPolicy,
) -> Option<QueuePolicy> {
    let raw = raw?;
    let mut q = QueuePolicy::default();
    if let Some(n) = v.positive("queue.max_queued", raw.max_queued, 10_000_000) {
        q.max_queued = n as usize;
    }
    if let Some(n) = v.positive("queue.max_queued_bytes", raw.max_queued_bytes, 1 << 40) {
        q.max_queued_bytes = n as usize;
    }
    for (name, c) in &raw.classes {
        let path = format!("queue.classes.{name}");
        let Some(class) = Class::parse(name) else {
            v.err(
                &path,
                format!("unknown class {name:?} (one of \"interactive\", \"standard\", \"batch\")"),
            );
            continue;
        };
        let max_request_ms = server.max_request.as_millis() as u64;
        let at = class.index();
        if let Some(ms) = v.positive(&format!("{path}.max_wait_ms"), c.max_wait_ms, u64::MAX >> 1) {
            if ms > max_request_ms {
                v.err(
                    format!("{path}.max_wait_ms"),
                    format!("must be ≤ server.max_request_secs ({max_request_ms} ms): a request may not wait longer than it may run"),
                );
            } else {
                q.classes[at].max_wait = Duration::from_millis(ms);
            }
        }
        if c.max_starve_ms.is_some() && class != Class::Batch {
            v.err(
                format!("{path}.max_starve_ms"),
                "only batch has a starvation guard (the higher classes are served first)",
            );
        } else if let Some(ms) = v.positive(
            &format!("{path}.max_starve_ms"),
            c.max_starve_ms,
            86_400_000,
        ) {
            q.classes[at].max_starve = Some(Duration::from_millis(ms));
        }
    }
    for (kind, classes) in &raw.wait_on {
        let path = format!("queue.wait_on.{kind}");
        let Some(k) = WaitKind::parse(kind) else {
            v.err(
                &path,
                format!("unknown budget kind {kind:?} (one of \"upstream\", \"parent\", \"own\")"),
            );
            continue;
        };
        let mut allowed = [false; 3];
        for (i, name) in classes.iter().enumerate() {
            match Class::parse(name) {
                Some(c) => allowed[c.index()] = true,
                None => v.err(
                    format!("{path}[{i}]"),
                    format!(
                        "unknown class {name:?} (one of \"interactive\", \"standard\", \"batch\")"
                    ),
                ),
            }
        }
        q.wait_on[match k {
            WaitKind::Upstream => 0,
            WaitKind::Parent => 1,
            WaitKind::Own => 2,
        }] = allowed;
    }
    Some(q)
}

#[cfg(test)]
mod tests {
    use crate::config::queue::Class;
    use crate::config::Policy;

    const KEY: &str = "0000000000000000000000000000000000000000000000000000000000000000";

    #[test]
    fn priority_and_weight_are_inherited_from_the_nearest_ancestor_and_keys_override_them() {
        let text = format!(
            r#"
[[tenants]]
name = "org"
priority = "batch"
weight = 4

[[tenants]]
name = "team"
parent = "org"
weight = 2
keys = [{{ id = "chat", sha256 = "{KEY}", priority = "interactive", weight = 7 }}]

[[tenants]]
name = "solo"
"#
        );
        let p = Policy::from_toml(&text).expect("valid");
        let t = |n: &str| p.tenants.iter().find(|t| t.name == n).unwrap();
        assert_eq!((t("org").priority, t("org").weight), (Class::Batch, 4));
        assert_eq!((t("team").priority, t("team").weight), (Class::Batch, 2));
        assert_eq!((t("solo").priority, t("solo").weight), (Class::Standard, 1));
        let k = &t("team").keys[0];
        assert_eq!((k.priority, k.weight), (Some(Class::Interactive), Some(7)));
        assert!(p.queue.is_none(), "no [queue]: no waiting");
    }

    #[test]
    fn a_queue_section_takes_the_defaults_of_the_issue_and_its_overrides() {
        let p = Policy::from_toml(
            "[queue]\nmax_queued = 5\n[queue.classes.batch]\nmax_wait_ms = 20000\nmax_starve_ms = 3000\n[queue.wait_on]\nown = []\n",
        )
        .expect("valid");
        let q = p.queue.expect("[queue]");
        assert_eq!(q.max_queued, 5);
        assert_eq!(q.class(Class::Batch).max_wait.as_millis(), 20_000);
        assert_eq!(
            q.class(Class::Batch).max_starve.map(|d| d.as_millis()),
            Some(3000)
        );
        assert_eq!(q.class(Class::Interactive).max_wait.as_millis(), 5000);
        assert!(!q.may_wait(crate::config::queue::WaitKind::Own, Class::Batch));
        assert!(q.may_wait(crate::config::queue::WaitKind::Upstream, Class::Batch));
    }
}
