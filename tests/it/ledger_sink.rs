//! The ledger's sink on both databases it runs on (issue 29, point 4): a
//! batch cut into every statement size, written again after a lost reply
//! (as the writer retries), lands as one row per reservation, with every
//! column read back as written, the same on SQLite and PostgreSQL.

use std::sync::Arc;

use budgetgate::control::db::Db;
use budgetgate::ledger::sql::SqlLedger;
use budgetgate::ledger::{LedgerSink, SpendOutcome, SpendQuery, SpendReader, SpendRow};

use crate::support::postgres::PgServer;

/// Row `i`: text with quotes, a semicolon and unicode, every count distinct.
fn row(i: u64) -> SpendRow {
    let ancestors: Vec<Arc<str>> = match i % 3 {
        0 => vec![],
        1 => vec!["org".into()],
        _ => vec!["dept".into(), "org".into()],
    };
    SpendRow {
        reservation_id: format!("r-{i:05}"),
        at_micros: 1_700_000_000_000_000 + i,
        tenant: "team 'a'; DROP TABLE spend_ledger; --".into(),
        ancestors: ancestors.into(),
        key_id: format!("k-{}", i % 7).into(),
        end_user: i.is_multiple_of(2).then(|| Arc::from(format!("ü-{i}"))),
        model: "gpt-4o-mini".into(),
        deployment: "west".into(),
        dialect: "chat",
        input_tokens: i,
        cached_read_tokens: i + 1,
        cache_write_tokens: i + 2,
        output_tokens: i + 3,
        reasoning_tokens: i / 2,
        charged_tokens: 2 * i + 3,
        cost_micros: 10 * i,
        outcome: if i.is_multiple_of(5) {
            SpendOutcome::Voided
        } else {
            SpendOutcome::Answered
        },
        price_version: "v\"1\"".into(),
    }
}

async fn written_twice_is_one_row(url: &str) {
    let db = Db::open(url)
        .await
        .expect("the database opens and migrates");
    let ledger = SqlLedger::new(db.pool().clone(), db.kind());
    // 341 = 256 + 64 + 16 + 4 + 1: every statement size once.
    let first: Vec<SpendRow> = (0..341).map(row).collect();
    assert_eq!(ledger.write(&first).await.expect("written"), 341);
    // The same batch again (its reply was lost), and one overlapping it.
    assert_eq!(ledger.write(&first).await.expect("written again"), 0);
    let overlap: Vec<SpendRow> = (300..400).map(row).collect();
    assert_eq!(ledger.write(&overlap).await.expect("overlap"), 59);

    let q = SpendQuery {
        group_by: vec![],
        period: None,
        from_micros: 0,
        to_micros: u64::MAX / 2,
        within: None,
        scope: None,
        top: None,
    };
    let back = ledger.rows(&q, 10_000).await.expect("read back");
    let want: Vec<SpendRow> = (0..400).map(row).collect();
    assert_eq!(back.len(), 400, "{url}: one row per reservation");
    for (got, want) in back.iter().zip(&want) {
        assert_eq!(got, want, "{url}: every column as written");
    }
}

#[tokio::test]
async fn a_batch_written_twice_is_one_row_per_reservation_on_sqlite_and_postgresql() {
    let dir = tempfile::tempdir().unwrap();
    written_twice_is_one_row(&format!("sqlite://{}", dir.path().join("c.db").display())).await;
    let pg = PgServer::start();
    written_twice_is_one_row(&pg.url()).await;
}
