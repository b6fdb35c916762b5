//! Priority classes, the kinds of budget a waiter may wait for, and the
//! validated `[queue]` settings (DESIGN "Wait queues").

use std::time::Duration;

/// A request's priority class. Strict priority between classes:
/// `Interactive` before `Standard` before `Batch` (the declaration order is
/// the order of service).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Class {
    /// Chat and other requests a person waits for.
    Interactive,
    /// The default.
    #[default]
    Standard,
    /// Background work: waits longest, also on the tenant's own budgets.
    Batch,
}

impl Class {
    /// Every class, in order of service.
    pub const ALL: [Class; 3] = [Class::Interactive, Class::Standard, Class::Batch];

    /// The config and header spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Interactive => "interactive",
            Class::Standard => "standard",
            Class::Batch => "batch",
        }
    }

    /// The class spelled `s` (config, `x-budgetgate-priority`).
    pub fn parse(s: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// Position in [`Class::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// `self` lowered to `asked` when the client asked for a lower class;
    /// a raise is refused (`Err` with the class kept).
    pub fn lowered_to(self, asked: Class) -> Result<Class, Class> {
        if asked >= self {
            Ok(asked)
        } else {
            Err(self)
        }
    }
}

/// Which kind of budget refused, as far as waiting is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitKind {
    /// A deployment's budget, shared by every tenant.
    Upstream,
    /// A budget of one of the tenant's ancestors (shared by its siblings).
    Parent,
    /// The tenant's own entitlement (its tenant, key, tenant × model and
    /// end-user budgets).
    Own,
}

impl WaitKind {
    /// Every kind, in `wait_on` order.
    pub const ALL: [WaitKind; 3] = [WaitKind::Upstream, WaitKind::Parent, WaitKind::Own];

    /// The config spelling (`[queue.wait_on]` keys).
    pub fn as_str(self) -> &'static str {
        match self {
            WaitKind::Upstream => "upstream",
            WaitKind::Parent => "parent",
            WaitKind::Own => "own",
        }
    }

    /// The kind spelled `s`.
    pub fn parse(s: &str) -> Option<WaitKind> {
        WaitKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// `[queue.classes.<class>]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassPolicy {
    /// Longest a request of the class waits (a request's
    /// `x-budgetgate-max-wait-ms` may lower it).
    pub max_wait: Duration,
    /// `batch` only: a waiter older than this gets a turn ahead of the
    /// higher classes, at most one such turn per `max_starve` per line.
    pub max_starve: Option<Duration>,
}

/// `[queue]`: present means requests may wait instead of being refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuePolicy {
    /// Per class, in [`Class::ALL`] order.
    pub classes: [ClassPolicy; 3],
    /// Most requests waiting at once in this gateway.
    pub max_queued: usize,
    /// Most bytes of waiting requests (bodies and a fixed overhead each).
    pub max_queued_bytes: usize,
    /// `wait_on[kind][class]`: a refusal by a budget of `kind` may wait
    /// for requests of `class`.
    pub wait_on: [[bool; 3]; 3],
}

/// Defaults of `[queue]` (docs/DESIGN.md, "Wait queues").
pub const DEFAULT_MAX_WAIT: [Duration; 3] = [
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(30),
];
/// Default `max_starve_ms` of `batch`.
pub const DEFAULT_MAX_STARVE: Duration = Duration::from_secs(10);
/// Default `max_queued`.
pub const DEFAULT_MAX_QUEUED: usize = 10_000;
/// Default `max_queued_bytes` (64 MiB).
pub const DEFAULT_MAX_QUEUED_BYTES: usize = 64 << 20;
/// Memory a waiter takes besides its body (request state, line entry).
pub const WAITER_OVERHEAD_BYTES: usize = 2048;

impl Default for QueuePolicy {
    fn default() -> Self {
        QueuePolicy {
            classes: [0, 1, 2].map(|i| ClassPolicy {
                max_wait: DEFAULT_MAX_WAIT[i],
                max_starve: (i == Class::Batch.index()).then_some(DEFAULT_MAX_STARVE),
            }),
            max_queued: DEFAULT_MAX_QUEUED,
            max_queued_bytes: DEFAULT_MAX_QUEUED_BYTES,
            wait_on: QueuePolicy::default_wait_on(),
        }
    }
}

impl QueuePolicy {
    /// By default a shared upstream budget and a parent's budgets may be
    /// waited for by every class; a tenant's own entitlement only by `batch`.
    pub fn default_wait_on() -> [[bool; 3]; 3] {
        [[true; 3], [true; 3], [false, false, true]]
    }

    /// The settings of `class`.
    pub fn class(&self, class: Class) -> &ClassPolicy {
        &self.classes[class.index()]
    }

    /// Whether a refusal by a budget of `kind` may wait for `class`.
    pub fn may_wait(&self, kind: WaitKind, class: Class) -> bool {
        self.wait_on[kind.index()][class.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_may_lower_its_class_but_never_raise_it() {
        assert_eq!(Class::Standard.lowered_to(Class::Batch), Ok(Class::Batch));
        assert_eq!(
            Class::Standard.lowered_to(Class::Interactive),
            Err(Class::Standard)
        );
        assert_eq!(Class::Batch.lowered_to(Class::Batch), Ok(Class::Batch));
    }

    #[test]
    fn by_default_only_batch_waits_for_its_own_entitlement() {
        let q = QueuePolicy::default();
        assert!(q.may_wait(WaitKind::Upstream, Class::Interactive));
        assert!(q.may_wait(WaitKind::Parent, Class::Standard));
        assert!(!q.may_wait(WaitKind::Own, Class::Standard));
        assert!(q.may_wait(WaitKind::Own, Class::Batch));
    }
}
