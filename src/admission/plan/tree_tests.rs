//! Budgets of a nested tenant and of its end users.

use super::*;
use crate::budget::keys::hash_tag;

/// Four levels (`org` > `dept` > `team` > `app`), each with a few
/// limits and end-user limits, a per-model limit on the org.
const TREE: &str = r#"
[store]
domain = "d1"
[[upstreams]]
name = "u"
base_url = "http://127.0.0.1:9/v1"
limits = { rpm = 10, tpm = 1000 }
[[models]]
name = "m"
upstreams = ["u"]
[[tenants]]
name = "org"
limits = { tpm = 100, tokens_per_day = 1000 }
model_limits = { m = { rpm = 5 } }
end_user_limits = { rpm = 3 }
shadow = true
[[tenants]]
name = "dept"
parent = "org"
limits = { rpm = 50 }
[[tenants]]
name = "team"
parent = "dept"
limits = { max_concurrent = 4 }
end_user_limits = { tpm = 30 }
[[tenants]]
name = "app"
parent = "team"
keys = [{ id = "k", sha256 = "0000000000000000000000000000000000000000000000000000000000000000", limits = { rpm = 2 } }]
limits = { tpm = 60 }
"#;

fn policy() -> Policy {
    // SAFETY (set_var): the one value every test of this binary sets.
    unsafe { std::env::set_var("BUDGETGATE_END_USER_KEY", "unit-test-end-user-key") };
    Policy::from_toml(TREE).unwrap()
}

#[test]
fn a_leaf_reserves_on_every_level_in_one_domain() {
    let p = policy();
    let ks = KeySpace::new(&p.store.key_prefix, &p.store.domain);
    let app = &p.tenants[3];
    let m = p.model("m").unwrap();
    let common = tenant_budgets(&ks, &p, app, &app.keys[0], m);
    let got: Vec<String> = common
        .iter()
        .map(|s| {
            format!(
                "{} {}{}",
                s.scope,
                s.name,
                if s.shadow { " shadow" } else { "" }
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            "tenant:app tpm",
            "key:app/k rpm",
            "tenant:team max_concurrent",
            "tenant:dept rpm",
            "tenant:org tpm shadow",
            "tenant:org tokens_per_day shadow",
            "tenant_model:org/m rpm shadow",
        ]
    );
    let hash: std::sync::Arc<str> = p.end_user_key.as_ref().unwrap().hash(b"u{1}\n").into();
    let users = end_user_plan(&ks, &p, app, &hash).0;
    let got: Vec<String> = users
        .iter()
        .map(|s| format!("{} {} {}", s.scope, s.name, s.shadow))
        .collect();
    assert_eq!(
        got,
        [
            format!("end_user:team/{hash} tpm false"),
            format!("end_user:org/{hash} rpm true"),
        ]
    );
    let upstream = upstream_budgets(&ks, &p.upstreams[0]);
    for s in common.iter().chain(&users).chain(&upstream) {
        assert_eq!(hash_tag(&s.key), Some("d1"), "{}", s.key);
    }
    assert!(p.tenants[0].ancestors.is_empty());
    assert_eq!(app.ancestors, [2, 1, 0]);
    assert!(app.reads_end_user && !app.end_user_required);
    assert_eq!(
        p.requester_of(app).as_deref(),
        Some("tenant app, child of team, child of dept, child of org")
    );
}

/// The `tenant` layout: every budget of a tree (each level, its keys, its
/// end users) under the top-level tenant's tag, the deployment under its
/// group's; a bad layout name is refused at load.
#[test]
fn the_tenant_layout_puts_a_tree_in_its_top_level_tenants_domain() {
    let toml = TREE.replace("domain = \"d1\"", "domain = \"d1\"\nlayout = \"tenant\"");
    // SAFETY (set_var): the one value every test of this binary sets.
    unsafe { std::env::set_var("BUDGETGATE_END_USER_KEY", "unit-test-end-user-key") };
    let p = Policy::from_toml(&toml).unwrap();
    let ks = key_space(&p);
    let app = &p.tenants[3];
    let m = p.model("m").unwrap();
    let hash: std::sync::Arc<str> = p.end_user_key.as_ref().unwrap().hash(b"someone").into();
    let tree: Vec<BudgetSpec> = tenant_budgets(&ks, &p, app, &app.keys[0], m)
        .into_iter()
        .chain(end_user_plan(&ks, &p, app, &hash).0)
        .collect();
    assert!(tree.len() > 7);
    for s in &tree {
        assert_eq!(hash_tag(&s.key), Some("d1.t.org"), "{}", s.key);
    }
    for c in candidate_budgets(&ks, &p, m) {
        for s in c {
            assert_eq!(hash_tag(&s.key), Some("d1.d.u"), "{}", s.key);
        }
    }
    let bad = TREE.replace("domain = \"d1\"", "domain = \"d1\"\nlayout = \"shards\"");
    let err = Policy::from_toml(&bad).unwrap_err().to_string();
    assert!(err.contains("store.layout"), "{err}");
}
