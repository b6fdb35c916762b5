//! Memory-store micro-benchmark: one reserve + settle pair across
//! the budgets a typical request touches (tenant RPM, TPM, concurrency and
//! daily quota; upstream RPM, TPM and concurrency), in ns per pair.
//! Limits are high enough that nothing is ever refused (each settle refunds
//! the whole token reservation; 50 M requests per minute of RPM burst).

use std::hint::black_box;
use std::sync::Arc;

use budgetgate::admission::plan::scope_budgets;
use budgetgate::budget::keys::KeySpace;
use budgetgate::budget::memory::MemoryStore;
use budgetgate::budget::{ReserveOutcome, ReserveRequest, Scope, SettleOutcome, Settlement};
use budgetgate::clock::{Clock, SystemClock};
use budgetgate::config::Limits;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn request(ks: &KeySpace) -> ReserveRequest {
    let big = 50_000_000;
    let tenant = Limits {
        rpm: Some(big),
        tpm: Some(big),
        max_concurrent: Some(100_000),
        tokens_per_day: Some(big * 1000),
        ..Limits::default()
    };
    let upstream = Limits {
        rpm: Some(big),
        tpm: Some(big),
        max_concurrent: Some(100_000),
        ..Limits::default()
    };
    ReserveRequest {
        share: None,
        id: String::new(),
        costs: budgetgate::budget::Costs::tokens(300),
        common: scope_budgets(ks, Scope::Tenant("acme".into()), &tenant, true),
        candidates: vec![scope_budgets(
            ks,
            Scope::Upstream("mock".into()),
            &upstream,
            true,
        )],
        slot_lease_micros: 30_000_000,
        hold_ttl_micros: 900_000_000,
        requester: Default::default(),
    }
}

fn benches(c: &mut Criterion) {
    let ks = KeySpace::new("bg", "default");
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = MemoryStore::new(clock);
    let mut req = request(&ks);
    let mut n = 0u64;
    let mut g = c.benchmark_group("memory_store");
    g.throughput(Throughput::Elements(1));
    g.bench_function("reserve_settle_pair", |b| {
        b.iter(|| {
            n += 1;
            req.id = format!("bench-{n}");
            let r = store.reserve_sync(black_box(&req));
            assert!(matches!(r, ReserveOutcome::Admitted(_)), "{r:?}");
            let s = store.settle_sync(
                &req.id,
                &Settlement {
                    // Refund everything, so millions of pairs never drain the buckets.
                    actual_tokens: 0,
                    upstream_failed: false,
                    actual: budgetgate::budget::Actual::Tokens,
                },
            );
            assert!(matches!(s, SettleOutcome::Settled { .. }));
        })
    });
    g.finish();
}

criterion_group!(memory_store, benches);
criterion_main!(memory_store);
