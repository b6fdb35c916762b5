#[test]
fn a_batch_is_cut_into_the_few_cached_statement_sizes() {
    for n in [0usize, 1, 3, 4, 5, 63, 64, 300, 1_000, 5_003] {
        let rows: Vec<usize> = (0..n).collect();
        let sizes: Vec<usize> = super::chunks(&rows).map(<[usize]>::len).collect();
        assert_eq!(sizes.iter().sum::<usize>(), n, "{n} rows");
        assert!(
            sizes.iter().all(|s| super::STATEMENT_ROWS.contains(s)),
            "{sizes:?}"
        );
        assert!(
            sizes.windows(2).all(|w| w[0] >= w[1]),
            "largest first: {sizes:?}"
        );
        let flat: Vec<usize> = super::chunks(&rows).flatten().copied().collect();
        assert_eq!(flat, rows, "in order, each once");
    }
}
use super::*;
use crate::ledger::query::{parse_date, Dimension, Period};

/// A SQLite file in a temp dir with the ledger's migrations applied.
async fn ledger() -> (Arc<SqlLedger>, tempfile::TempDir) {
    sqlx::any::install_default_drivers();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("l.db").display());
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .unwrap();
    for migration in [
        include_str!("../../../migrations/sqlite/0100_spend_ledger.sql"),
        include_str!("../../../migrations/sqlite/0101_spend_ledger_request_ids.sql"),
        include_str!("../../../migrations/sqlite/0102_spend_ledger_decided_by.sql"),
        include_str!("../../../migrations/sqlite/0103_spend_ledger_run_id.sql"),
        include_str!("../../../migrations/sqlite/0104_spend_ledger_run_index.sql"),
    ] {
        sqlx::raw_sql(migration).execute(&pool).await.unwrap();
    }
    (SqlLedger::new(pool, DbKind::Sqlite), dir)
}

fn row(id: &str, tenant: &str, ancestors: &[&str], model: &str, at: u64, cost: u64) -> SpendRow {
    SpendRow {
        reservation_id: id.into(),
        request_id: format!("req-{id}"),
        attempt: 1,
        at_micros: at,
        tenant: tenant.into(),
        ancestors: ancestors.iter().map(|a| Arc::<str>::from(*a)).collect(),
        key_id: "k1".into(),
        end_user: None,
        model: model.into(),
        deployment: "east".into(),
        dialect: "chat",
        input_tokens: 10,
        cached_read_tokens: 2,
        cache_write_tokens: 1,
        output_tokens: 5,
        reasoning_tokens: 3,
        charged_tokens: 18,
        cost_micros: cost,
        outcome: SpendOutcome::Answered,
        price_version: "v1".into(),
        decided_by: "store",
        run_id: None,
    }
}

fn day(s: &str) -> u64 {
    parse_date(s).unwrap()
}

#[tokio::test]
async fn a_row_written_again_is_ignored_and_rows_come_back_as_written() {
    let (l, _dir) = ledger().await;
    let mut odd = row("r1", "ml", &["acme"], "gpt-4o", day("2026-11-30") + 5, 70);
    odd.end_user = Some("'; DROP TABLE spend_ledger; --".into());
    odd.key_id = "ключ \"quoted\"".into();
    let rows = vec![
        odd.clone(),
        row("r2", "acme", &[], "gpt-4o", day("2026-12-01"), 30),
    ];
    assert_eq!(l.write(&rows).await.unwrap(), 2);
    assert_eq!(
        l.write(&rows).await.unwrap(),
        0,
        "idempotent by reservation id"
    );
    let q = SpendQuery {
        group_by: vec![],
        period: None,
        from_micros: day("2026-11-01"),
        to_micros: day("2026-12-02"),
        within: None,
        scope: None,
        top: None,
        request_id: None,
        run_id: None,
        decided_by: None,
    };
    let back = l.rows(&q, 10).await.unwrap();
    assert_eq!(back, rows, "stored literally, in time order");
}

#[tokio::test]
async fn spend_is_summed_per_group_and_day_within_a_subtree_and_range() {
    let (l, _dir) = ledger().await;
    let d1 = day("2026-11-30");
    let d2 = day("2026-12-01");
    l.write(&[
        row("a", "ml", &["acme"], "gpt-4o", d1 + 1, 10),
        row("b", "ml", &["acme"], "gpt-4o", d1 + 2, 20),
        row("c", "ml", &["acme"], "o3", d2 + 1, 40),
        row("d", "web", &["acme"], "gpt-4o", d2 + 3, 80),
        row("e", "other", &[], "gpt-4o", d2 + 4, 160),
        row("f", "ml", &["acme"], "gpt-4o", day("2026-10-31"), 320),
    ])
    .await
    .unwrap();
    let q = SpendQuery {
        group_by: vec![Dimension::Tenant, Dimension::Model],
        period: Some(Period::Month),
        from_micros: day("2026-11-01"),
        to_micros: day("2026-12-31"),
        within: Some("acme".into()),
        scope: None,
        top: None,
        request_id: None,
        run_id: None,
        decided_by: None,
    };
    let groups = crate::ledger::query::spend(&*l, &q).await.unwrap();
    let got: Vec<(String, Vec<String>, u64, u64)> = groups
        .iter()
        .map(|g| {
            (
                g.period.clone().unwrap(),
                g.key.clone(),
                g.totals.requests,
                g.totals.cost_micros,
            )
        })
        .collect();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        got,
        [
            ("2026-11".into(), s(&["ml", "gpt-4o"]), 2, 30),
            ("2026-12".into(), s(&["ml", "o3"]), 1, 40),
            ("2026-12".into(), s(&["web", "gpt-4o"]), 1, 80),
        ]
    );
    let ml_only = SpendQuery {
        group_by: vec![],
        period: None,
        within: Some("ml".into()),
        scope: None,
        ..q
    };
    let g = crate::ledger::query::spend(&*l, &ml_only).await.unwrap();
    assert_eq!((g[0].totals.requests, g[0].totals.cost_micros), (3, 70));
    assert_eq!(
        (g[0].totals.input_tokens, g[0].totals.reasoning_tokens),
        (30, 9)
    );
}

#[tokio::test]
async fn a_scope_matches_the_subtree_the_rows_recorded() {
    let (l, _dir) = ledger().await;
    // beta-team's rows under beta; later a new beta-team under acme.
    l.write(&[
        row("old", "beta-team", &["beta"], "m", 100, 5),
        row("new", "beta-team", &["acme"], "m", 200, 7),
        row("mine", "acme", &[], "m", 300, 11),
    ])
    .await
    .unwrap();
    let q = |within: Option<&str>, scope: Option<&str>| SpendQuery {
        group_by: vec![],
        period: None,
        from_micros: 0,
        to_micros: 1_000,
        within: within.map(String::from),
        scope: scope.map(String::from),
        top: None,
        request_id: None,
        run_id: None,
        decided_by: None,
    };
    let ids = |rows: Vec<SpendRow>| {
        rows.into_iter()
            .map(|r| r.reservation_id)
            .collect::<Vec<_>>()
    };
    let got = l
        .rows(&q(Some("beta-team"), Some("acme")), 10)
        .await
        .unwrap();
    assert_eq!(ids(got), ["new"], "the old tenant of that name stays out");
    let got = l.rows(&q(None, Some("acme")), 10).await.unwrap();
    assert_eq!(ids(got), ["new", "mine"]);
    let got = l.rows(&q(Some("beta-team"), None), 10).await.unwrap();
    assert_eq!(ids(got), ["old", "new"], "unscoped: every row of the name");
    let g = crate::ledger::query::spend(&*l, &q(Some("beta-team"), Some("acme")))
        .await
        .unwrap();
    assert_eq!((g[0].totals.requests, g[0].totals.cost_micros), (1, 7));
}

#[tokio::test]
async fn rows_past_the_retention_are_deleted() {
    let (l, _dir) = ledger().await;
    l.write(&[
        row("old-3", "t", &[], "m", 130, 1),
        row("old-1", "t", &[], "m", 110, 1),
        row("new", "t", &[], "m", 200, 1),
        row("old-2", "t", &[], "m", 120, 1),
        row("edge", "t", &[], "m", 150, 1),
    ])
    .await
    .unwrap();
    // In batches of at most two, oldest first; fewer than two: done.
    assert_eq!(l.prune(150, 2).await.unwrap(), 2);
    let left = |rows: Vec<SpendRow>| {
        rows.into_iter()
            .map(|r| r.reservation_id)
            .collect::<Vec<_>>()
    };
    let all = SpendQuery {
        group_by: vec![],
        period: None,
        from_micros: 0,
        to_micros: 1_000,
        within: None,
        scope: None,
        top: None,
        request_id: None,
        run_id: None,
        decided_by: None,
    };
    assert_eq!(
        left(l.rows(&all, 10).await.unwrap()),
        ["old-3", "edge", "new"]
    );
    assert_eq!(l.prune(150, 2).await.unwrap(), 1);
    assert_eq!(l.prune(150, 2).await.unwrap(), 0);
    let q = SpendQuery {
        group_by: vec![],
        period: None,
        from_micros: 0,
        to_micros: 1_000,
        within: None,
        scope: None,
        top: None,
        request_id: None,
        run_id: None,
        decided_by: None,
    };
    let ids: Vec<String> = l
        .rows(&q, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.reservation_id)
        .collect();
    assert_eq!(ids, ["edge", "new"]);
}

#[tokio::test]
async fn a_request_id_finds_every_attempt_of_it_within_the_callers_subtree() {
    let (l, _dir) = ledger().await;
    let attempt =
        |id: &str, tenant: &str, ancestors: &[&str], request: &str, n: u32, at: u64| SpendRow {
            request_id: request.into(),
            attempt: n,
            ..row(id, tenant, ancestors, "m", at, 1)
        };
    // One request of ml retried once; another tenant's client sent the
    // same id; an unrelated request.
    l.write(&[
        attempt("r1", "ml", &["acme"], "client-7", 1, 100),
        attempt("r2", "ml", &["acme"], "client-7", 2, 110),
        attempt("r3", "other", &[], "client-7", 1, 120),
        attempt("r4", "ml", &["acme"], "client-8", 1, 130),
    ])
    .await
    .unwrap();
    let q = |request: &str, scope: Option<&str>| SpendQuery {
        group_by: vec![],
        period: None,
        from_micros: 0,
        to_micros: 1_000,
        within: None,
        scope: scope.map(String::from),
        top: None,
        request_id: Some(request.into()),
        run_id: None,
        decided_by: None,
    };
    let got = |rows: Vec<SpendRow>| {
        rows.into_iter()
            .map(|r| (r.reservation_id, r.attempt))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        got(l.rows(&q("client-7", None), 10).await.unwrap()),
        [("r1".into(), 1), ("r2".into(), 2), ("r3".into(), 1)]
    );
    assert_eq!(
        got(l.rows(&q("client-7", Some("acme")), 10).await.unwrap()),
        [("r1".into(), 1), ("r2".into(), 2)],
        "another tenant's request of the same id stays out"
    );
    assert_eq!(
        got(l.rows(&q("client-7", Some("other")), 10).await.unwrap()),
        [("r3".into(), 1)]
    );
    assert!(l.rows(&q("nobody", None), 10).await.unwrap().is_empty());
    let totals = crate::ledger::query::spend(&*l, &q("client-7", Some("acme")))
        .await
        .unwrap();
    assert_eq!(totals[0].totals.requests, 2);
}

#[tokio::test]
async fn the_extent_of_a_window_counts_its_rows_first_time_and_largest_charge() {
    let (l, _dir) = ledger().await;
    let mut big = row("r2", "ml", &["acme"], "gpt-4o", day("2026-12-01") + 20, 90);
    big.charged_tokens = 400;
    let rows = vec![
        row("r1", "ml", &["acme"], "gpt-4o", day("2026-12-01") + 10, 30),
        big,
        row("r3", "other", &[], "gpt-4o", day("2026-12-01") + 5, 999),
        row("r4", "ml", &["acme"], "gpt-4o", day("2026-12-02"), 500),
    ];
    l.write(&rows).await.unwrap();
    let q = |within: &str| SpendQuery {
        group_by: vec![],
        period: None,
        from_micros: day("2026-12-01"),
        to_micros: day("2026-12-02"),
        within: Some(within.into()),
        scope: None,
        top: None,
        request_id: None,
        run_id: None,
        decided_by: None,
    };
    let x = l.extent(&q("acme")).await.unwrap();
    assert_eq!(x.rows, 2);
    assert_eq!(x.first_micros, Some(day("2026-12-01") + 10));
    assert_eq!((x.max_charged_tokens, x.max_cost_micros), (400, 90));
    let none = l.extent(&q("nobody")).await.unwrap();
    assert_eq!(none, crate::ledger::query::Extent::default());
}
