//! `GET /v1/budget` (a key holder's own budgets) is an unmetered store
//! read: each key's answer is kept for at most a second and says its age.
//! Fault guarded against: a client polling it in a loop cost one store
//! read per call, with no budget of its own to stop it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use budgetgate::budget::memory::MemoryStore;
use budgetgate::budget::StoreError;
use budgetgate::clock::{Clock, ManualClock};
use serde_json::Value;

use crate::support::config::key;
use crate::support::store_spy::{Call, Hooks, Spy};
use crate::support::*;

const SECOND_KEY: &str = "sk-own-budget-second";

#[derive(Default)]
struct CountInspects(AtomicUsize);

#[async_trait]
impl Hooks for CountInspects {
    async fn before(&self, call: Call) -> Result<u64, StoreError> {
        if call == Call::Inspect {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        Ok(0)
    }
}

async fn own_budget(gw: &Gateway, key: &str) -> Value {
    let r = reqwest::Client::new()
        .get(format!("{}/budget", gw.base_url()))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// The tenant's daily tokens left (a quota: nothing refills it within the test).
fn left_today(v: &Value) -> i64 {
    v["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["scope"] == "tenant:t1" && b["budget"] == "tokens_per_day")
        .and_then(|b| b["remaining"].as_i64())
        .unwrap_or_else(|| panic!("no tokens_per_day in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_budget_reads_the_store_at_most_once_a_second_per_key_and_says_its_age() {
    let mock = start_mock().await;
    let clock = ManualClock::new(NOON);
    let c: Arc<dyn Clock> = Arc::new(clock.clone());
    let store = Arc::new(Spy {
        inner: Arc::new(MemoryStore::new(c)),
        hooks: CountInspects::default(),
    });
    let mut cfg = TestConfig::standard(&mock.base_url(), 50, limits().tokens_per_day(1_000_000));
    cfg.tenant("t1").keys.push(key("k2", SECOND_KEY));
    let gw = cfg.start_with(clock.clone(), store.clone()).await;
    let reads = || store.0.load(Ordering::SeqCst);

    let first = own_budget(&gw, KEY).await;
    assert_eq!(first["age_micros"], 0, "{first}");
    let after_first = reads();
    assert!(after_first >= 1);
    // Spend, then ask again within the second: the kept answer, aged.
    assert_eq!(post_hi(&gw, KEY).await, 200);
    gw.settled().await;
    clock.advance(400_000);
    let reads_before = reads();
    for _ in 0..50 {
        let again = own_budget(&gw, KEY).await;
        assert_eq!(again["age_micros"], 400_000, "{again}");
        assert_eq!(left_today(&again), left_today(&first));
    }
    assert_eq!(
        reads(),
        reads_before,
        "50 reads within a second: no store call"
    );

    // Another key has an answer of its own.
    let other = own_budget(&gw, SECOND_KEY).await;
    assert_eq!(other["age_micros"], 0);
    assert_eq!(reads(), reads_before + 1);

    // Past a second: read again, the spend shows.
    clock.advance(700_000);
    let fresh = own_budget(&gw, KEY).await;
    assert_eq!(fresh["age_micros"], 0, "{fresh}");
    assert!(left_today(&fresh) < left_today(&first), "{fresh}");
    assert_eq!(reads(), reads_before + 2);
    // Bounded by the policy's keys (two).
    assert!(gw.state.own_budgets.len() <= 2);
}
