//! The ledger in the control database (`spend_ledger`, migration 0100):
//! the sink the writer fills and the reader of the spend queries. One SQL
//! text serves SQLite and PostgreSQL: `$N` placeholders (both accept
//! them), `ON CONFLICT … DO NOTHING` (both), sums cast back to BIGINT
//! (PostgreSQL's SUM of a BIGINT is NUMERIC). The one exception is the
//! batch INSERT on SQLite, written with anonymous `?`: sqlx's SQLite
//! driver binds a named parameter (`$N`) by asking SQLite for its name,
//! a lookup that scans the statement's parameter list, so a 5,632-value
//! INSERT bound by name costs more than the rows it writes. Client text
//! only ever travels as bound values; column names come from
//! [`Dimension::column`].

use std::sync::Arc;

use sqlx::any::AnyRow;
use sqlx::Row;

use super::batcher::{LedgerError, LedgerSink};
use super::query::{day_of, DayTotal, Extent, SpendQuery, SpendReader, SpendTotals};
use super::{SpendOutcome, SpendRow};
use crate::db::DbKind;

/// Columns of one inserted row.
const COLUMNS: [&str; 26] = [
    "reservation_id",
    "request_id",
    "attempt",
    "at_micros",
    "day",
    "tenant",
    "ancestor_1",
    "ancestor_2",
    "ancestor_3",
    "ancestor_4",
    "key_id",
    "end_user",
    "model",
    "deployment",
    "dialect",
    "input_tokens",
    "cached_read_tokens",
    "cache_write_tokens",
    "output_tokens",
    "reasoning_tokens",
    "charged_tokens",
    "cost_micros",
    "outcome",
    "price_version",
    "decided_by",
    "run_id",
];

/// Rows per INSERT statement, largest first: a batch is cut greedily into
/// these sizes, so each connection prepares (parses) at most five
/// statements once and then finds them in its statement cache. A statement
/// per batch size would be parsed again for every batch: SQLite's parser
/// then cost more than the requests the rows describe. 26 × 256 bound
/// values stays under SQLite's 32,766 and PostgreSQL's 65,535.
const STATEMENT_ROWS: [usize; 5] = [256, 64, 16, 4, 1];

/// `rows` cut into chunks of [`STATEMENT_ROWS`] sizes, largest first.
fn chunks<T>(rows: &[T]) -> impl Iterator<Item = &[T]> {
    let mut rest = rows;
    std::iter::from_fn(move || {
        let size = STATEMENT_ROWS.iter().copied().find(|&n| n <= rest.len())?;
        let (chunk, tail) = rest.split_at(size);
        rest = tail;
        Some(chunk)
    })
}

/// The ledger's table over a control-database pool. The pool lives on
/// the runtime that made it (serving thread 0's for the queries, the
/// writer thread's for the writer's own pool); queries from handlers on
/// other serving threads run there.
pub struct SqlLedger {
    pool: sqlx::AnyPool,
    runtime: tokio::runtime::Handle,
    /// The INSERT of each [`STATEMENT_ROWS`] size, in this database's
    /// placeholders, built once.
    inserts: [Arc<str>; STATEMENT_ROWS.len()],
    /// The DELETE of one prune batch, in this database's dialect.
    prune: &'static str,
    kind: DbKind,
}

/// One prune batch: the oldest rows past the retention, at most `$2`,
/// found through the `at_micros` index. SQLite deletes them by rowid (its
/// table's own key, no second index lookup); PostgreSQL by primary key.
const PRUNE_SQLITE: &str = "DELETE FROM spend_ledger WHERE rowid IN \
     (SELECT rowid FROM spend_ledger WHERE at_micros < $1 ORDER BY at_micros LIMIT $2)";
const PRUNE_POSTGRES: &str = "DELETE FROM spend_ledger WHERE reservation_id IN \
     (SELECT reservation_id FROM spend_ledger WHERE at_micros < $1 ORDER BY at_micros LIMIT $2)";

fn db(e: sqlx::Error) -> LedgerError {
    LedgerError(e.to_string())
}

/// A u64 as the BIGINT it is stored as (every count and µ$ sum stays far
/// below 2^63; a larger one is clamped, never wrapped).
fn big(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn unbig(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl SqlLedger {
    /// The ledger in `pool`'s database of `kind` (migrated by the control
    /// plane), its queries run on the calling runtime.
    pub fn new(pool: sqlx::AnyPool, kind: DbKind) -> Arc<Self> {
        Arc::new(Self {
            pool,
            runtime: tokio::runtime::Handle::current(),
            inserts: STATEMENT_ROWS.map(|n| Self::insert_sql(n, kind).into()),
            prune: match kind {
                DbKind::Sqlite => PRUNE_SQLITE,
                DbKind::Postgres => PRUNE_POSTGRES,
            },
            kind,
        })
    }

    /// Runs `f` over the pool on the pool's runtime.
    async fn on_pool<T, F, Fut>(&self, f: F) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: FnOnce(sqlx::AnyPool) -> Fut,
        Fut: std::future::Future<Output = Result<T, LedgerError>> + Send + 'static,
    {
        self.runtime
            .spawn(f(self.pool.clone()))
            .await
            .map_err(|e| LedgerError(e.to_string()))?
    }

    fn insert_sql(rows: usize, kind: DbKind) -> String {
        use std::fmt::Write;
        let mut sql = format!("INSERT INTO spend_ledger ({}) VALUES ", COLUMNS.join(", "));
        let mut n = 0;
        for r in 0..rows {
            if r > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            for c in 0..COLUMNS.len() {
                if c > 0 {
                    sql.push_str(", ");
                }
                n += 1;
                match kind {
                    DbKind::Sqlite => sql.push('?'),
                    DbKind::Postgres => {
                        let _ = write!(sql, "${n}");
                    }
                }
            }
            sql.push(')');
        }
        sql.push_str(" ON CONFLICT (reservation_id) DO NOTHING");
        sql
    }

    /// The WHERE clause of `q` with its first placeholder at `$1`, and the
    /// values to bind.
    fn filter(q: &SpendQuery) -> (String, Vec<FilterValue>) {
        let mut sql = String::from(" WHERE at_micros >= $1 AND at_micros < $2");
        let mut values = vec![
            FilterValue::Int(big(q.from_micros)),
            FilterValue::Int(big(q.to_micros)),
        ];
        // Each subtree is matched on the names the row recorded: `within`
        // (the tenant asked for) and `scope` (the caller's own subtree),
        // so a name reused after a delete does not bring back the old
        // tenant's rows to a caller scoped elsewhere.
        if let Some(id) = &q.request_id {
            sql.push_str(&format!(" AND request_id = ${}", values.len() + 1));
            values.push(FilterValue::Text(id.clone()));
        }
        if let Some(run) = &q.run_id {
            sql.push_str(&format!(" AND run_id = ${}", values.len() + 1));
            values.push(FilterValue::Text(run.clone()));
        }
        if let Some(layer) = q.decided_by {
            sql.push_str(&format!(" AND decided_by = ${}", values.len() + 1));
            values.push(FilterValue::Text(layer.to_string()));
        }
        for t in [&q.within, &q.scope].into_iter().flatten() {
            let n = values.len();
            sql.push_str(&format!(
                " AND (tenant = ${} OR ancestor_1 = ${} OR ancestor_2 = ${} OR ancestor_3 = ${} OR ancestor_4 = ${})",
                n + 1,
                n + 2,
                n + 3,
                n + 4,
                n + 5
            ));
            for _ in 0..5 {
                values.push(FilterValue::Text(t.clone()));
            }
        }
        (sql, values)
    }
}

enum FilterValue {
    Int(i64),
    Text(String),
}

fn bind_filter<'q>(
    mut query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    values: Vec<FilterValue>,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    for v in values {
        query = match v {
            FilterValue::Int(i) => query.bind(i),
            FilterValue::Text(s) => query.bind(s),
        };
    }
    query
}

#[async_trait::async_trait]
impl LedgerSink for SqlLedger {
    async fn write(&self, rows: &[SpendRow]) -> Result<u64, LedgerError> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        let mut new = 0;
        for chunk in chunks(rows) {
            let Some(at) = STATEMENT_ROWS.iter().position(|&n| n == chunk.len()) else {
                return Err(LedgerError(format!("no statement of {} rows", chunk.len())));
            };
            // Fixed column names and placeholders only: no client text.
            let mut query = sqlx::query(sqlx::AssertSqlSafe(self.inserts[at].clone()));
            for r in chunk {
                let ancestor = |i: usize| r.ancestors.get(i).map(|a| &**a);
                query = query
                    .bind(r.reservation_id.as_str())
                    .bind(r.request_id.as_str())
                    .bind(i64::from(r.attempt))
                    .bind(big(r.at_micros))
                    .bind(day_of(r.at_micros))
                    .bind(&*r.tenant)
                    .bind(ancestor(0))
                    .bind(ancestor(1))
                    .bind(ancestor(2))
                    .bind(ancestor(3))
                    .bind(&*r.key_id)
                    .bind(r.end_user.as_deref().unwrap_or(""))
                    .bind(&*r.model)
                    .bind(&*r.deployment)
                    .bind(r.dialect)
                    .bind(big(r.input_tokens))
                    .bind(big(r.cached_read_tokens))
                    .bind(big(r.cache_write_tokens))
                    .bind(big(r.output_tokens))
                    .bind(big(r.reasoning_tokens))
                    .bind(big(r.charged_tokens))
                    .bind(big(r.cost_micros))
                    .bind(r.outcome.as_str())
                    .bind(&*r.price_version)
                    .bind(r.decided_by)
                    .bind(r.run_id.as_deref().unwrap_or(""));
            }
            new += query.execute(&mut *tx).await.map_err(db)?.rows_affected();
        }
        tx.commit().await.map_err(db)?;
        Ok(new)
    }

    async fn prune(&self, before_micros: u64, at_most: u64) -> Result<u64, LedgerError> {
        let done = sqlx::query(self.prune)
            .bind(big(before_micros))
            .bind(big(at_most))
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(done.rows_affected())
    }

    async fn refuses_connections(&self, within: std::time::Duration) -> bool {
        use sqlx::{ConnectOptions, Connection};
        if self.kind != DbKind::Postgres {
            return false;
        }
        // A connection of its own: the pool's attempts retry a refused
        // connection until its acquire timeout, telling nothing.
        match tokio::time::timeout(within, self.pool.connect_options().connect()).await {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                false
            }
            // Refused, unresolvable, unreachable: no server at the address.
            Ok(Err(sqlx::Error::Io(_))) => true,
            // It answered (an authentication or a server error), or it
            // accepts but is slow: it may still take the rows.
            Ok(Err(_)) | Err(_) => false,
        }
    }
}

#[async_trait::async_trait]
impl SpendReader for SqlLedger {
    async fn days(&self, q: &SpendQuery) -> Result<Vec<DayTotal>, LedgerError> {
        let q = q.clone();
        self.on_pool(move |pool| async move { days(&pool, &q).await })
            .await
    }

    async fn rows(&self, q: &SpendQuery, limit: usize) -> Result<Vec<SpendRow>, LedgerError> {
        let q = q.clone();
        self.on_pool(move |pool| async move { rows(&pool, &q, limit).await })
            .await
    }

    async fn extent(&self, q: &SpendQuery) -> Result<Extent, LedgerError> {
        let q = q.clone();
        self.on_pool(move |pool| async move { extent(&pool, &q).await })
            .await
    }
}

async fn extent(pool: &sqlx::AnyPool, q: &SpendQuery) -> Result<Extent, LedgerError> {
    let (filter, values) = SqlLedger::filter(q);
    let sql = format!(
        "SELECT COUNT(*), MIN(at_micros), MAX(charged_tokens), MAX(cost_micros) FROM spend_ledger{filter}"
    );
    let row = bind_filter(sqlx::query(sqlx::AssertSqlSafe(sql)), values)
        .fetch_one(pool)
        .await
        .map_err(db)?;
    let opt = |i: usize| {
        row.try_get::<Option<i64>, _>(i)
            .map(|v| v.map(unbig))
            .map_err(db)
    };
    Ok(Extent {
        rows: opt(0)?.unwrap_or(0),
        first_micros: opt(1)?,
        max_charged_tokens: opt(2)?.unwrap_or(0),
        max_cost_micros: opt(3)?.unwrap_or(0),
    })
}

async fn days(pool: &sqlx::AnyPool, q: &SpendQuery) -> Result<Vec<DayTotal>, LedgerError> {
    {
        let dims: Vec<&str> = q.group_by.iter().map(|d| d.column()).collect();
        let mut select: Vec<String> = dims.iter().map(|c| c.to_string()).collect();
        select.push("day".into());
        select.push("COUNT(*)".into());
        for c in [
            "input_tokens",
            "cached_read_tokens",
            "cache_write_tokens",
            "output_tokens",
            "reasoning_tokens",
            "charged_tokens",
            "cost_micros",
        ] {
            select.push(format!("CAST(SUM({c}) AS BIGINT)"));
        }
        let (filter, values) = SqlLedger::filter(q);
        let mut group: Vec<&str> = dims.clone();
        group.push("day");
        let sql = format!(
            "SELECT {} FROM spend_ledger{filter} GROUP BY {}",
            select.join(", "),
            group.join(", ")
        );
        let rows = bind_filter(sqlx::query(sqlx::AssertSqlSafe(sql)), values)
            .fetch_all(pool)
            .await
            .map_err(db)?;
        let n = dims.len();
        rows.iter()
            .map(|row| {
                let mut key = Vec::with_capacity(n);
                for i in 0..n {
                    key.push(row.try_get::<String, _>(i).map_err(db)?);
                }
                let int = |i: usize| row.try_get::<i64, _>(i).map(unbig).map_err(db);
                Ok(DayTotal {
                    key,
                    day: row.try_get::<i64, _>(n).map_err(db)?,
                    totals: SpendTotals {
                        requests: int(n + 1)?,
                        input_tokens: int(n + 2)?,
                        cached_read_tokens: int(n + 3)?,
                        cache_write_tokens: int(n + 4)?,
                        output_tokens: int(n + 5)?,
                        reasoning_tokens: int(n + 6)?,
                        charged_tokens: int(n + 7)?,
                        cost_micros: int(n + 8)?,
                    },
                })
            })
            .collect()
    }
}

async fn rows(
    pool: &sqlx::AnyPool,
    q: &SpendQuery,
    limit: usize,
) -> Result<Vec<SpendRow>, LedgerError> {
    let (filter, values) = SqlLedger::filter(q);
    let sql = format!(
        "SELECT {} FROM spend_ledger{filter} ORDER BY at_micros, reservation_id LIMIT {}",
        COLUMNS.join(", "),
        limit
    );
    let rows = bind_filter(sqlx::query(sqlx::AssertSqlSafe(sql)), values)
        .fetch_all(pool)
        .await
        .map_err(db)?;
    rows.iter().map(row_of).collect()
}

fn row_of(row: &AnyRow) -> Result<SpendRow, LedgerError> {
    let text = |c: &str| row.try_get::<String, _>(c).map_err(db);
    let int = |c: &str| row.try_get::<i64, _>(c).map(unbig).map_err(db);
    let mut ancestors: Vec<Arc<str>> = Vec::new();
    for c in ["ancestor_1", "ancestor_2", "ancestor_3", "ancestor_4"] {
        if let Some(a) = row.try_get::<Option<String>, _>(c).map_err(db)? {
            ancestors.push(a.into());
        }
    }
    let end_user = text("end_user")?;
    let dialect = text("dialect")?;
    let outcome = text("outcome")?;
    let decided_by = text("decided_by")?;
    let run_id = text("run_id")?;
    Ok(SpendRow {
        reservation_id: text("reservation_id")?,
        request_id: text("request_id")?,
        attempt: u32::try_from(int("attempt")?).unwrap_or(u32::MAX),
        at_micros: int("at_micros")?,
        tenant: text("tenant")?.into(),
        ancestors: ancestors.into(),
        key_id: text("key_id")?.into(),
        end_user: (!end_user.is_empty()).then(|| end_user.into()),
        model: text("model")?.into(),
        deployment: text("deployment")?.into(),
        dialect: super::capture::DIALECTS
            .iter()
            .copied()
            .find(|d| *d == dialect)
            .unwrap_or("unknown"),
        input_tokens: int("input_tokens")?,
        cached_read_tokens: int("cached_read_tokens")?,
        cache_write_tokens: int("cache_write_tokens")?,
        output_tokens: int("output_tokens")?,
        reasoning_tokens: int("reasoning_tokens")?,
        charged_tokens: int("charged_tokens")?,
        cost_micros: int("cost_micros")?,
        outcome: SpendOutcome::parse(&outcome)
            .ok_or_else(|| LedgerError(format!("unknown outcome {outcome:?}")))?,
        price_version: text("price_version")?.into(),
        decided_by: crate::admission::AnsweredBy::ADMITTING
            .iter()
            .map(|a| a.label())
            .find(|l| *l == decided_by)
            .unwrap_or(""),
        run_id: (!run_id.is_empty()).then(|| run_id.into()),
    })
}

#[cfg(test)]
mod tests;
