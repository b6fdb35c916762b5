//! Fleet-wide shares in the store (`budget::share`):
//! these tests run in `store_conformance`'s suite, unchanged against the
//! memory store, the Redis store on one node and on a 3-node Redis Cluster,
//! on one manual clock each, so every value is exact. Faults guarded
//! against: a tenant ahead of its weighted share taking capacity a waiting
//! tenant behind it is owed (shares then follow who asks first, whatever
//! the weights); a lower class taking capacity a waiting higher class
//! needs; a share state written for an uncontended deployment (the Lua
//! path's cost); capacity deferred for a tenant that no longer waits;
//! a tenant's later request admitted before its older waiter that the
//! store has seen (FIFO within a tenant broken across gateways), or kept
//! behind one that has gone.

use std::sync::Arc;

use budgetgate::budget::share::{ClaimOrder, ShareClaim, ACTIVE_MICROS};
use budgetgate::budget::{BudgetSpec, Costs, ReserveOutcome, ReserveRequest, Scope};

use super::store_conformance::{admitted, denied, tenant, H};

const MS: u64 = 1000;

fn claim(t: &str, rank: u8, weight: u64) -> ShareClaim {
    ShareClaim {
        tenant: Arc::from(t),
        rank,
        weight,
        order: None,
    }
}

/// Reserves `tokens` on deployment `up` with `claim`.
async fn claim_on(
    h: &H,
    id: &str,
    tokens: u64,
    up: &[BudgetSpec],
    c: &ShareClaim,
) -> ReserveOutcome {
    let req = ReserveRequest {
        id: id.to_string(),
        costs: Costs::tokens(tokens),
        common: vec![h.tpm(tenant(), 1_000_000, 1_000_000)],
        candidates: vec![up.to_vec()],
        slot_lease_micros: 10_000_000,
        hold_ttl_micros: 120_000_000,
        requester: Default::default(),
        share: Some(c.clone()),
    };
    h.store.reserve(&req).await.expect("reserve")
}

async fn share_keys(h: &H) -> usize {
    h.keys()
        .await
        .iter()
        .filter(|k| k.ends_with(":share"))
        .count()
}

fn upstream() -> Scope {
    Scope::Upstream("pool/gpt".into())
}

/// One deployment of 1,000 tokens a second (burst 1,000); "heavy" weight 3,
/// "light" weight 1, requests of 400 tokens.
pub(crate) async fn a_waiting_tenant_behind_its_share_gets_the_capacity_first(h: H) {
    let up = [h.tpm(upstream(), 60_000, 1000)];
    let (heavy, light) = (claim("heavy", 1, 3), claim("light", 1, 1));
    admitted(claim_on(&h, "h1", 400, &up, &heavy).await);
    admitted(claim_on(&h, "h2", 400, &up, &heavy).await);
    assert_eq!(share_keys(&h).await, 0, "uncontended: no share state");
    // Light is refused by the deployment: it now waits there.
    let d = denied(claim_on(&h, "l1", 400, &up, &light).await);
    assert_eq!((d.held_for_share, d.retry_after_micros), (false, 200 * MS));
    h.clock.advance(200 * MS);
    // Both new to the share state, so level: heavy is not behind light, nor
    // ahead of it: the first to ask gets it.
    admitted(claim_on(&h, "h3", 400, &up, &heavy).await);
    let d = denied(claim_on(&h, "l2", 400, &up, &light).await);
    assert!(!d.held_for_share);
    h.clock.advance(400 * MS);
    // Heavy is now 400 × 1000 / 3 lead units ahead and light waits: the
    // budget has the tokens, they go to light.
    let d = denied(claim_on(&h, "h4", 400, &up, &heavy).await);
    assert!(d.held_for_share, "{d:?}");
    assert_eq!(
        (d.scope.clone(), d.available, d.retry_after_micros),
        (upstream(), 400, 400 * MS),
        "named after the deployment's bucket, retry after its own cost's refill"
    );
    admitted(claim_on(&h, "l3", 400, &up, &light).await);
    // Light (400,000) is now ahead of heavy (133,333): heavy is owed the
    // next turn, but this refusal is the empty bucket's.
    let d = denied(claim_on(&h, "h5", 400, &up, &heavy).await);
    assert!(!d.held_for_share);
    h.clock.advance(400 * MS);
    let d = denied(claim_on(&h, "l4", 400, &up, &light).await);
    assert!(d.held_for_share, "heavy waits and is behind");
    // Weight 3: heavy is admitted three times (its steps floor: 3 × 133,333
    // < 400,000) before light is behind again; light keeps asking.
    admitted(claim_on(&h, "h6", 400, &up, &heavy).await);
    h.clock.advance(400 * MS);
    admitted(claim_on(&h, "h7", 400, &up, &heavy).await);
    assert!(!denied(claim_on(&h, "l5", 400, &up, &light).await).held_for_share);
    h.clock.advance(400 * MS);
    admitted(claim_on(&h, "h8", 400, &up, &heavy).await);
    h.clock.advance(400 * MS);
    let d = denied(claim_on(&h, "h9", 400, &up, &heavy).await);
    assert!(d.held_for_share, "{d:?}");
    admitted(claim_on(&h, "l6", 400, &up, &light).await);
    assert_eq!(share_keys(&h).await, usize::from(h.raw.is_some()));
    // A second after the last claim the state is gone: nothing deferred.
    h.clock.advance(ACTIVE_MICROS + 400 * MS);
    admitted(claim_on(&h, "h10", 400, &up, &heavy).await);
    admitted(claim_on(&h, "h11", 400, &up, &heavy).await);
    h.check_keys().await;
}

/// A waiting higher class holds a lower one back until it is admitted,
/// not longer (no idle capacity once it is served).
pub(crate) async fn a_waiting_higher_class_goes_first_fleet_wide(h: H) {
    let up = [h.tpm(upstream(), 60_000, 1000)];
    let (chat, jobs) = (claim("chat", 0, 1), claim("jobs", 2, 5));
    admitted(claim_on(&h, "j1", 900, &up, &jobs).await);
    denied(claim_on(&h, "c1", 200, &up, &chat).await);
    h.clock.advance(300 * MS);
    let d = denied(claim_on(&h, "j2", 200, &up, &jobs).await);
    assert_eq!((d.held_for_share, d.retry_after_micros), (true, 200 * MS));
    admitted(claim_on(&h, "c2", 200, &up, &chat).await);
    admitted(claim_on(&h, "j3", 200, &up, &jobs).await);
    h.check_keys().await;
}

/// Waiter `id` of tenant "t": waited `waited` ms so far, `left` ms left.
fn waiter(id: u64, waited: u64, left: u64) -> ShareClaim {
    ShareClaim {
        order: Some(ClaimOrder {
            id,
            waited_micros: waited * MS,
            left_micros: left * MS,
        }),
        ..claim("t", 1, 1)
    }
}

/// Within a tenant, the oldest waiter the store has seen refused goes
/// first, whichever gateway the others ask from; a waiter gone frees the
/// order by its deadline, and a last attempt is deferred by no one.
pub(crate) async fn a_tenants_oldest_waiter_goes_first_fleet_wide(h: H) {
    let up = [h.tpm(upstream(), 60_000, 1000)];
    let other = claim("u", 1, 1);
    admitted(claim_on(&h, "u1", 400, &up, &other).await);
    admitted(claim_on(&h, "u2", 400, &up, &other).await);
    // Waiter 1 (waiting 2 s) is refused by the deployment: 200 tokens left.
    let d = denied(claim_on(&h, "w1a", 400, &up, &waiter(1, 2000, 5000)).await);
    assert!(!d.held_for_share);
    h.clock.advance(400 * MS);
    // 600 tokens: a younger request of its tenant is deferred for it.
    let d = denied(claim_on(&h, "w2a", 400, &up, &waiter(2, 0, 5000)).await);
    assert!(d.held_for_share, "{d:?}");
    assert_eq!(d.retry_after_micros, 400 * MS);
    admitted(claim_on(&h, "w1b", 400, &up, &waiter(1, 2400, 4600)).await);
    // Waiter 1 gone (admitted): waiter 2 is refused by the bucket and takes
    // the first place; waiter 3, younger, waits behind it.
    assert!(!denied(claim_on(&h, "w2b", 400, &up, &waiter(2, 10, 4990)).await).held_for_share);
    h.clock.advance(400 * MS);
    assert!(denied(claim_on(&h, "w3a", 400, &up, &waiter(3, 0, 300)).await).held_for_share);
    // A last attempt (nothing left) is not deferred.
    admitted(claim_on(&h, "w4", 400, &up, &waiter(4, 9000, 0)).await);
    h.clock.advance(200 * MS);
    // Waiter 3 is younger than waiter 2 whoever asks first.
    assert!(denied(claim_on(&h, "w3b", 400, &up, &waiter(3, 200, 100)).await).held_for_share);
    // Waiter 2 leaves without a word: a second after its latest refusal
    // (well before its deadline) the others are no longer deferred for it.
    h.clock.advance(ACTIVE_MICROS - 200 * MS);
    admitted(claim_on(&h, "w5", 400, &up, &waiter(5, 0, 5000)).await);
    admitted(claim_on(&h, "w6", 400, &up, &waiter(6, 0, 5000)).await);
    // Waiter 7, refused with 250 ms left, holds the first place until its
    // deadline only.
    assert!(!denied(claim_on(&h, "w7", 400, &up, &waiter(7, 0, 250)).await).held_for_share);
    h.clock.advance(200 * MS);
    assert!(denied(claim_on(&h, "w8a", 400, &up, &waiter(8, 0, 5000)).await).held_for_share);
    h.clock.advance(50 * MS);
    admitted(claim_on(&h, "w8b", 400, &up, &waiter(8, 50, 4950)).await);
    h.check_keys().await;
}
