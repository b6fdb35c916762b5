//! The key-layout bump to v3 keeps every quota: a quota
//! counter written by a v2 gateway is honoured by v3 until v3 has its own
//! (its first write carries the v2 count forward). Bucket state may start
//! full under the new layout.
//!
//! Run: `cargo test --all-features --test redis_layout`.

use std::sync::Arc;
use std::time::Duration;

use crate::support::redis_server;
use crate::support::NOON;
use budgetgate::budget::keys::{KeySpace, LAYOUT_VERSION};
use budgetgate::budget::redis::RedisStore;
use budgetgate::budget::{
    BudgetKind, BudgetName, BudgetSpec, BudgetStore, ReserveOutcome, ReserveRequest, Scope, Window,
};
use budgetgate::clock::ManualClock;

#[tokio::test]
async fn a_v2_quota_counter_is_honoured_by_v3() {
    assert_eq!(LAYOUT_VERSION, 3);
    let server = redis_server::shared();
    let prefix = format!("bglayout{}", std::process::id());
    let ks = KeySpace::new(&prefix, "d");
    let scope = Scope::Tenant("acme".into());
    let day = BudgetSpec {
        key: ks.budget(&scope, BudgetName::TokensPerDay).into(),
        scope,
        name: BudgetName::TokensPerDay,
        kind: BudgetKind::Quota {
            limit: 200_000,
            window: Window::Day,
        },
        refund_unused: true,
        shadow: false,
    };
    // What a v2 gateway stored: 126,000 tokens used today.
    let v2 = ks.previous_layout(&day.key).expect("a v2 key");
    assert_eq!(v2, day.key.replace(":v3:", ":v2:"));
    let mut value = Vec::new();
    value.extend_from_slice(&(Window::Day.id(NOON) as f64).to_le_bytes());
    value.extend_from_slice(&126_000f64.to_le_bytes());
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(&v2)
        .arg(value)
        .arg("PX")
        .arg(3_600_000)
        .query_async(&mut raw)
        .await
        .unwrap();

    let clock = ManualClock::new(NOON);
    let store = RedisStore::connect(&server.url(), Duration::from_secs(5), ks.clone())
        .await
        .unwrap()
        .with_test_clock(Arc::new(clock));
    let left = store.inspect(std::slice::from_ref(&day)).await.unwrap()[0].remaining;
    assert_eq!(left, 74_000, "v3 reads the v2 counter");
    let req = |id: &str, tokens| ReserveRequest {
        share: None,
        id: id.into(),
        costs: budgetgate::budget::Costs::tokens(tokens),
        common: vec![day.clone()],
        candidates: vec![vec![]],
        slot_lease_micros: 10_000_000,
        hold_ttl_micros: 60_000_000,
        requester: Default::default(),
    };
    let r = store.reserve(&req("big", 80_000)).await.unwrap();
    assert!(matches!(r, ReserveOutcome::Denied(_)), "{r:?}");
    let r = store.reserve(&req("fits", 70_000)).await.unwrap();
    assert!(matches!(r, ReserveOutcome::Admitted(_)), "{r:?}");
    // v3 now has its own counter, carried forward from v2.
    let left = store.inspect(std::slice::from_ref(&day)).await.unwrap()[0].remaining;
    assert_eq!(left, 4_000);
    let v3: Option<Vec<u8>> = redis::cmd("GET")
        .arg(&*day.key)
        .query_async(&mut raw)
        .await
        .unwrap();
    let v3 = v3.expect("v3 counter written");
    assert_eq!(f64::from_le_bytes(v3[8..16].try_into().unwrap()), 196_000.0);
}
