//! One reservation's holds in several places, answered as one: a
//! reservation over a tenant domain and a deployment domain in the Redis
//! store (`redis::domains`), or a store hold and a lease hold in the
//! gateway (`admission::quota_lease`, a leased deployment beside an exact
//! tenant). Pure functions over the outcomes of each hold.

use crate::budget::{Admission, ExtendOutcome, RenewOutcome, SettleOutcome};
use crate::config::bounds::MAX_LIMIT;

/// Both admissions as one: the deployment domain's time and candidate
/// (`candidate`, its index in the whole request), every budget's state
/// (tenant's first, as one call lists them).
pub fn joined(tenant: Admission, deployment: Admission, candidate: usize) -> Admission {
    let mut budgets = tenant.budgets;
    budgets.extend(deployment.budgets);
    let mut would_deny = tenant.would_deny;
    would_deny.extend(deployment.would_deny);
    Admission {
        now_micros: deployment.now_micros,
        candidate,
        budgets,
        replayed: tenant.replayed && deployment.replayed,
        would_deny,
    }
}

/// One settle (or void, `actual` = `None`) outcome of several holds. A
/// hold missing in some domain is reported (`Unknown` wins for a settle:
/// the lost-reply compensation then voids, writing the tombstone there);
/// otherwise the figures one domain would give: reserved as the hold that
/// reserved least (the one every extension's grant reached: an extension
/// the deployment granted short leaves the tenant hold with more), and a
/// refund when any hold refunded (one domain refunds when any of its
/// budgets does), against `actual` tokens (capped as a settle caps them).
pub fn settled(outcomes: &[SettleOutcome], actual: Option<u64>) -> SettleOutcome {
    let rank = |o: &SettleOutcome| match (o, actual.is_none()) {
        (SettleOutcome::Unknown, false) => (0, 0),
        (SettleOutcome::Settled { reserved, .. }, _) => (1, *reserved),
        (SettleOutcome::Voided, _) => (2, 0),
        (SettleOutcome::AlreadySettled, _) => (3, 0),
        (SettleOutcome::Unknown, true) => (4, 0),
    };
    let Some(first) = outcomes.iter().min_by_key(|o| rank(o)).copied() else {
        return SettleOutcome::Unknown;
    };
    if outcomes.len() < 2 {
        return first;
    }
    match (first, actual) {
        (
            SettleOutcome::Settled {
                reserved,
                now_micros,
                ..
            },
            Some(actual),
        ) => {
            let actual = actual.min(MAX_LIMIT);
            let refunded_any = outcomes
                .iter()
                .any(|o| matches!(o, SettleOutcome::Settled { refunded, .. } if *refunded > 0));
            SettleOutcome::Settled {
                reserved,
                refunded: if refunded_any {
                    reserved.saturating_sub(actual)
                } else {
                    0
                },
                debt: actual.saturating_sub(reserved),
                now_micros,
            }
        }
        (o, _) => o,
    }
}

/// One renewal of several holds: the earliest end, unless a hold is gone.
pub fn renewed(outcomes: &[RenewOutcome]) -> RenewOutcome {
    let mut until = None;
    for o in outcomes {
        match o {
            RenewOutcome::Renewed {
                slot_lease_until_micros: u,
            } => until = Some(until.map_or(*u, |m: u64| m.min(*u))),
            other => return *other,
        }
    }
    match until {
        Some(u) => RenewOutcome::Renewed {
            slot_lease_until_micros: u,
        },
        None => RenewOutcome::Unknown,
    }
}

/// True when an extension of the first hold must go on to the next one.
pub fn granted(o: &ExtendOutcome) -> Option<u64> {
    match o {
        ExtendOutcome::Extended { granted, .. } => Some(*granted),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_of_several_holds() {
        let s = SettleOutcome::Settled {
            reserved: 1,
            refunded: 1,
            debt: 0,
            now_micros: 1,
        };
        assert_eq!(
            settled(&[s, SettleOutcome::Unknown], Some(1)),
            SettleOutcome::Unknown
        );
        assert_eq!(settled(&[SettleOutcome::AlreadySettled, s], Some(0)), s);
        assert_eq!(
            settled(&[SettleOutcome::Unknown, SettleOutcome::Voided], None),
            SettleOutcome::Voided
        );
        // The tenant hold kept what an extension's deployment did not
        // grant: one domain's figures are the deployment hold's.
        let settled_at = |reserved, refunded, debt| SettleOutcome::Settled {
            reserved,
            refunded,
            debt,
            now_micros: 1,
        };
        let (tenant, deployment) = (settled_at(600, 350, 0), settled_at(300, 50, 0));
        assert_eq!(settled(&[tenant, deployment], Some(250)), deployment);
        assert_eq!(
            settled(&[tenant, deployment], None),
            deployment,
            "a void refunds what one domain reserved"
        );
        // Tokens refunded when any hold has a refundable budget (here only
        // the deployment's), as one domain refunds.
        let (tenant, deployment) = (settled_at(38, 0, 0), settled_at(38, 38, 0));
        assert_eq!(settled(&[tenant, deployment], Some(0)), deployment);
        // Debt beyond the least reserved, none refunded.
        let (tenant, deployment) = (settled_at(600, 200, 0), settled_at(300, 0, 100));
        assert_eq!(
            settled(&[tenant, deployment], Some(400)),
            settled_at(300, 0, 100)
        );
    }
}
