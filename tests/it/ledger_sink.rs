//! The ledger's sink on both databases it runs on: a
//! batch cut into every statement size, written again after a lost reply
//! (as the writer retries), lands as one row per reservation, with every
//! column read back as written, the same on SQLite and PostgreSQL; a
//! request id finds every attempt of its request.
//! The retention prune of a large ledger: with a
//! million rows past the retention, rows settled during the prune are
//! written within the write timeout (one unbounded DELETE held every
//! write for its whole run).

use std::sync::Arc;

use budgetgate::db::Db;
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
        // Two attempts per request, the ids of three requests reused.
        request_id: format!("q-{}", i / 2 % 150),
        attempt: (i % 2) as u32 + 1,
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
        decided_by: ["store", "lease", "local_limiter"][(i % 3) as usize],
        run_id: None,
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
        request_id: None,
        run_id: None,
        decided_by: None,
    };
    let back = ledger.rows(&q, 10_000).await.expect("read back");
    let want: Vec<SpendRow> = (0..400).map(row).collect();
    assert_eq!(back.len(), 400, "{url}: one row per reservation");
    for (got, want) in back.iter().zip(&want) {
        assert_eq!(got, want, "{url}: every column as written");
    }

    // `q-7` names requests 7, 157 and 307 (their two attempts each).
    let by_id = SpendQuery {
        request_id: Some("q-7".into()),
        ..q.clone()
    };
    let got: Vec<(String, u32)> = ledger
        .rows(&by_id, 100)
        .await
        .expect("by request id")
        .into_iter()
        .map(|r| (r.reservation_id, r.attempt))
        .collect();
    let want: Vec<(String, u32)> = [14, 15, 314, 315]
        .into_iter()
        .map(|i| (format!("r-{i:05}"), (i % 2) as u32 + 1))
        .collect();
    assert_eq!(got, want, "{url}: rows 614 and 615 were never written");
    // Within a subtree: the rows under `dept` (i % 3 == 2) only.
    let scoped = SpendQuery {
        scope: Some("dept".into()),
        ..by_id
    };
    let got: Vec<String> = ledger
        .rows(&scoped, 100)
        .await
        .expect("by request id, scoped")
        .into_iter()
        .map(|r| r.reservation_id)
        .collect();
    assert_eq!(got, ["r-00014", "r-00314"], "{url}");

    // The retention prune, in batches: rows 0..100 are past it.
    let before = 1_700_000_000_000_000 + 100;
    for want in [40, 40, 20, 0] {
        assert_eq!(
            ledger.prune(before, 40).await.expect("prune"),
            want,
            "{url}"
        );
    }
    let left = ledger.rows(&q, 10_000).await.expect("read back");
    assert_eq!(left.len(), 300, "{url}");
    assert_eq!(
        left[0].reservation_id, "r-00100",
        "{url}: the oldest went first"
    );
}

#[tokio::test]
async fn a_batch_written_twice_is_one_row_per_reservation_on_sqlite_and_postgresql() {
    let dir = tempfile::tempdir().unwrap();
    written_twice_is_one_row(&format!("sqlite://{}", dir.path().join("c.db").display())).await;
    let pg = PgServer::start();
    written_twice_is_one_row(&pg.url()).await;
}

/// Rows past the retention in the SQLite ledger.
const OLD_ROWS: u64 = 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_settled_while_a_million_rows_are_pruned_are_written_within_the_write_timeout() {
    use budgetgate::clock::{Clock, ManualClock};
    use budgetgate::config::ledger::LedgerSettings;
    use budgetgate::ledger::{LedgerBuffer, LedgerWriter};
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("c.db").display());
    let db = Db::open(&url)
        .await
        .expect("the database opens and migrates");
    // The old rows in one statement: settled in the first second of 1970.
    let started = Instant::now();
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) \
         INSERT INTO spend_ledger (reservation_id, request_id, attempt, at_micros, day, tenant, \
             key_id, end_user, model, deployment, dialect, input_tokens, cached_read_tokens, \
             cache_write_tokens, output_tokens, reasoning_tokens, charged_tokens, cost_micros, \
             outcome, price_version) \
         SELECT printf('old-%07d', i), printf('old-%07d', i), 1, i % 1000000, 0, 't', 'k', '', \
             'm', 'd', 'chat', 1, 0, 0, 1, 0, 2, 3, 'answered', 'v' FROM n",
    )
    .bind(OLD_ROWS as i64)
    .execute(db.pool())
    .await
    .expect("bulk insert");
    let inserted = started.elapsed();

    let now: u64 = 1_800_000_000_000_000;
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(now));
    let settings = LedgerSettings {
        enabled: true,
        batch_interval: Duration::from_millis(100),
        batch_rows: 500,
        buffer_rows: 100_000,
        retention: Some(Duration::from_secs(86_400)),
        // Shorter than the default 10 s, so that one long DELETE shows.
        write_timeout: Duration::from_secs(1),
    };
    let write_timeout = settings.write_timeout;
    let buffer = Arc::new(LedgerBuffer::new(settings.buffer_rows, settings.batch_rows));
    let sink = SqlLedger::new(db.writer_pool().expect("writer pool"), db.kind());
    let writer = LedgerWriter::spawn(buffer.clone(), sink, settings, clock);

    // A row every 50 ms while old rows are left; each one's landing seen
    // by polling the table from another connection.
    let pruning_started = Instant::now();
    let mut recorded: Vec<Instant> = Vec::new();
    let mut landed: Vec<Option<Duration>> = Vec::new();
    let mut during_prune = 0usize;
    let mut pruned_in = None;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        assert!(
            Instant::now() < deadline,
            "the prune did not end within 180 s"
        );
        let old_left = sqlx::query("SELECT 1 FROM spend_ledger WHERE at_micros < $1 LIMIT 1")
            .bind(1_000_000i64)
            .fetch_optional(db.pool())
            .await
            .map(|r| r.is_some())
            // Busy: the writer holds the database; still pruning.
            .unwrap_or(true);
        if pruned_in.is_none() {
            if old_left {
                let mut r = row(recorded.len() as u64);
                r.reservation_id = format!("new-{:05}", recorded.len());
                r.at_micros = now;
                buffer.record(r);
                recorded.push(Instant::now());
                landed.push(None);
                during_prune += 1;
            } else {
                pruned_in = Some(pruning_started.elapsed());
            }
        }
        if let Ok(ids) = sqlx::query_scalar::<_, String>(
            "SELECT reservation_id FROM spend_ledger WHERE reservation_id >= 'new-' AND reservation_id < 'new.'",
        )
        .fetch_all(db.pool())
        .await
        {
            for id in ids {
                let k: usize = id["new-".len()..].parse().unwrap();
                if landed[k].is_none() {
                    landed[k] = Some(recorded[k].elapsed());
                }
            }
        }
        if pruned_in.is_some() && landed.iter().all(Option::is_some) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    writer.shutdown(Duration::from_secs(5)).await;

    let slowest = landed.iter().flatten().max().copied().unwrap_or_default();
    println!(
        "{OLD_ROWS} rows inserted in {inserted:?}, pruned in {:?}; {during_prune} rows settled during the prune, the slowest written after {slowest:?}",
        pruned_in.unwrap_or_default()
    );
    assert!(
        slowest <= write_timeout,
        "a row settled during the prune was written after {slowest:?}, past the write timeout {write_timeout:?}"
    );
    assert!(
        during_prune >= 5,
        "the prune ended before rows were settled during it ({during_prune})"
    );
    let (rows,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM spend_ledger")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(
        rows as usize, during_prune,
        "every old row deleted, every new one kept"
    );
}
