//! Propagation of control-database changes to this gateway.
//!
//! - The version counter is read every [`POLL`]: on SQLite the only
//!   signal; on PostgreSQL the backstop of a missed notification (a
//!   listener reconnecting loses what was sent meanwhile).
//! - PostgreSQL: `LISTEN budgetgate_control`; every change commits a
//!   `pg_notify`, which wakes the refresh at once.
//! - A full refresh every [`FULL_REFRESH`] whatever the counter says.
//! - `budgetgate_control_snapshot_age_seconds` every [`AGE_GAUGE`]: how
//!   long since a read found the served snapshot current (a gateway cut
//!   off from PostgreSQL shows it).
//!
//! A key's expiry and a rotated secret's end need none of this: they are
//! checked against the clock on every request.

use std::sync::Arc;
use std::time::Duration;

use super::writes::CHANNEL;
use super::ControlPlane;
use crate::db::DbKind;

/// How often the version counter is read.
pub const POLL: Duration = Duration::from_millis(250);

/// How often everything is read again.
pub const FULL_REFRESH: Duration = Duration::from_secs(30);

/// How often `budgetgate_control_snapshot_age_seconds` is set (apart from
/// the refresh: a read that hangs must not stop the age from growing).
pub const AGE_GAUGE: Duration = Duration::from_secs(1);

/// Starts propagation on the current runtime; the tasks run until aborted.
pub fn spawn(plane: Arc<ControlPlane>) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    if plane.db.kind() == DbKind::Postgres {
        tasks.push(tokio::spawn(listen(plane.clone())));
    }
    let aging = plane.clone();
    tasks.push(tokio::spawn(async move {
        let mut tick = tokio::time::interval(AGE_GAUGE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            crate::metrics::control_snapshot_age(aging.snapshot_age().as_secs_f64());
        }
    }));
    tasks.push(tokio::spawn(async move {
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut full = tokio::time::interval(FULL_REFRESH);
        full.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        full.tick().await;
        loop {
            let force = tokio::select! {
                _ = poll.tick() => false,
                _ = plane.changed.notified() => false,
                _ = full.tick() => true,
            };
            plane.refresh(force).await;
        }
    }));
    tasks
}

/// Wakes the refresh on every notification; reconnects after a failure.
async fn listen(plane: Arc<ControlPlane>) {
    loop {
        match sqlx::postgres::PgListener::connect(&plane.url).await {
            Ok(mut l) => match l.listen(CHANNEL).await {
                Ok(()) => {
                    // Whatever changed while no listener was connected.
                    plane.poke();
                    loop {
                        match l.recv().await {
                            Ok(_) => plane.poke(),
                            Err(e) => {
                                tracing::debug!(error = %e, "control listener lost its connection");
                                break;
                            }
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "control listener: LISTEN failed"),
            },
            Err(e) => tracing::debug!(error = %e, "control listener cannot connect"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
