//! A request's place in a line. [`Ticket::turn`] waits until the line
//! gives it the turn (then the request reserves), its deadline passes, or
//! the gateway shuts down. Dropping the ticket leaves the line (a client
//! that disconnects while waiting drops its handler, and with it this):
//! nothing is reserved while waiting, so leaving owes nothing.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::line::MyTurn;
use super::Queue;
use crate::config::queue::Class;

/// Why a wait ended without a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The request's `max_wait` is over.
    Deadline,
    /// The gateway is shutting down.
    Closed,
}

/// A waiter in the line of one budget.
pub struct Ticket {
    queue: Arc<Queue>,
    key: Arc<str>,
    id: u64,
    class: Class,
    bytes: usize,
    wake: Arc<Notify>,
    joined: Instant,
    left: bool,
}

impl Ticket {
    pub(super) fn new(
        queue: Arc<Queue>,
        key: Arc<str>,
        id: u64,
        class: Class,
        bytes: usize,
        wake: Arc<Notify>,
    ) -> Self {
        Ticket {
            queue,
            key,
            id,
            class,
            bytes,
            wake,
            joined: Instant::now(),
            left: false,
        }
    }

    /// The store key of the budget this waiter waits for.
    pub fn key(&self) -> &Arc<str> {
        &self.key
    }

    /// Since when it waits in this line.
    pub fn joined(&self) -> Instant {
        self.joined
    }

    /// Waits for this waiter's turn; `Ok` means: reserve now (the line
    /// counts the attempt as running until [`Ticket::refused`], or until
    /// the ticket is consumed).
    pub async fn turn(&self, deadline: Instant) -> Result<(), Ended> {
        let mut closed = self.queue.closed.subscribe();
        loop {
            if *closed.borrow_and_update() {
                return Err(Ended::Closed);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Ended::Deadline);
            }
            let (mine, began) = {
                let mut inner = self.queue.lock();
                match inner.lines.get_mut(&*self.key) {
                    Some(line) => {
                        let mine = line.my_turn(self.id);
                        let due = match mine {
                            MyTurn::Now => true,
                            MyTurn::At(at) => at <= now,
                            MyTurn::No => false,
                        };
                        (mine, due && line.begin(self.id, now))
                    }
                    None => (MyTurn::No, false),
                }
            };
            if began {
                return Ok(());
            }
            let until = match mine {
                MyTurn::At(at) => at.min(deadline),
                _ => deadline,
            };
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(until) => {}
                _ = closed.changed() => {}
            }
        }
    }

    /// This line's budget refused the attempt; it would fit after
    /// `retry_after`. The waiter stays in line.
    pub fn refused(&self, retry_after: Duration) {
        let id = self.id;
        self.queue.on_line(&self.key, |line| {
            line.refused(id, retry_after, Instant::now())
        });
    }

    /// The store held the attempt back for its tenant's fleet-wide share
    /// for `retry_after`: the waiter stays, others' tenants go first.
    pub fn defer_for_share(&self, retry_after: Duration) {
        let id = self.id;
        self.queue.on_line(&self.key, |line| {
            line.defer_for_share(id, retry_after, Instant::now())
        });
    }

    /// The attempt was admitted: the waiter leaves, the next one tries.
    /// Returns how long it waited in this line.
    pub fn admitted(mut self) -> Duration {
        self.leave_with(|line, id, now| line.admitted(id, now));
        self.joined.elapsed()
    }

    /// Leaves the line; `fits_here`: this line's budget admitted the
    /// last attempt (another budget refused it).
    pub fn leave(mut self, fits_here: bool) {
        self.leave_with(|line, id, now| line.leave(id, fits_here, now));
    }

    fn leave_with(&mut self, f: impl FnOnce(&mut super::Line, u64, Instant) -> super::Wakes) {
        if self.left {
            return;
        }
        self.left = true;
        let id = self.id;
        self.queue
            .remove(&self.key, self.class, self.bytes, |line, now| {
                f(line, id, now)
            });
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.leave_with(|line, id, now| line.leave(id, false, now));
    }
}
