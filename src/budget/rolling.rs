//! Rolling quota windows (`tokens_per_5h`, `tokens_per_24h`,
//! `tokens_per_week`, `usd_per_*` alike): a counter over fixed sub-buckets
//! that never over-admits, in pure integer math mirrored by `lua/lib.lua`
//! (`roll_*`).
//!
//! # Shape
//!
//! A window of length `W` is cut into `n` sub-buckets of length `g`
//! (`W = n·g`, [`Window::rolling`]): 5 h = 60 × 5 min, 24 h = 96 × 15 min,
//! a week = 168 × 1 h. Sub-bucket `b` covers the UTC µs `[b·g, (b+1)·g)`.
//! The state is a running total and the non-empty sub-buckets as
//! `(b, amount)`, oldest first. At time `t` in sub-bucket `c = ⌊t/g⌋` the
//! count is the sum over sub-buckets `c−n ..= c`: `n + 1` of them, the
//! oldest only partly inside the window `(t−W, t]`. A sub-bucket leaves the
//! count when `c > b + n`, i.e. at `(b + n + 1)·g`, the first instant at
//! which every µs it covers lies beyond the window.
//!
//! Cost: every call first drops the sub-buckets that have left, from the
//! front (each is appended once and dropped once: O(1) amortized per
//! call), then reads the total (O(1)); a debit adds to the last sub-bucket
//! or appends one. Only a refusal walks the sub-buckets (to say when
//! enough will have left), and a refund looks for its sub-bucket from the
//! newest end (a request's refund goes to a recent one).
//!
//! Bytes per budget (Redis value, `lua/lib.lua`): 8 for the total plus 16
//! per non-empty sub-bucket, at most `n + 1` of them: ≤ 984 bytes for
//! 5 h, ≤ 1,560 for 24 h, ≤ 2,712 for a week (one request a sub-bucket
//! fills every one; a budget used once an hour keeps 8 + 16·6 bytes for
//! 5 h). The memory store keeps the same pairs in a `VecDeque`.
//!
//! # Never over-admits
//!
//! Claim: for every interval `I` of length `W`, the units admitted in `I`
//! (reservations and extensions, less what settlement refunded of them)
//! are at most the limit. Debt charged at settlement lies outside the
//! claim, as for token buckets and calendar quotas (DESIGN section 2).
//!
//! Proof: let `t` be the last admission in `I`, in sub-bucket `c`. Every
//! admission `s ∈ I` has `s > t − W`, so its sub-bucket `⌊s/g⌋ ≥ ⌊(t − W
//! + 1)/g⌋ ≥ c − n`: every unit admitted in `I` before `t` sits in a
//! sub-bucket the count at `t` includes (refunds only lower what it holds,
//! and a refund lowers only the sub-bucket its units were admitted in).
//! The admission at `t` needed `count + cost ≤ limit`, so everything in
//! `I` sums to at most the limit. ∎
//!
//! # The price: early refusals, bounded
//!
//! Against an exact log (which counts the admissions in `(t − W, t]`), the
//! count at `t` holds in addition exactly the units of sub-bucket `c − n`
//! admitted at or before `t − W` (sub-buckets below `c − n` lie wholly
//! before `t − W`; every admission after `t − W` is in `c − n ..= c`). So a
//! request the exact log admits and the counter refuses is refused because
//! of the admissions of one sub-bucket at most, and only while that
//! sub-bucket is the oldest counted, which lasts one sub-bucket's length
//! `g`: at most one sub-bucket's admissions are refused early, for at most
//! `g` (5 min, 15 min, 1 h). Retry hints ([`Rolling::wait_for`]) name the
//! instant the oldest sub-buckets holding enough units leave; the exact
//! log would admit at most `g` earlier and never later (its count is
//! never above the counter's), and at the hinted instant the counter
//! admits (no other traffic meanwhile).
//!
//! # Refunds
//!
//! A hold records the sub-bucket of each debit (`(b, amount)`, as a
//! calendar quota's hold records its window); a refund goes back to that
//! sub-bucket, newest debit first, at most what the hold debited there and
//! what the sub-bucket still holds, and nothing goes back to a sub-bucket
//! that has left (its units left the count already). Extensions and debt
//! go to the sub-bucket current at that moment.
//!
//! # Integers
//!
//! Sub-bucket ids stay below 2^31 until year 2^31·5 min; amounts are those
//! of calendar quotas ([`super::MAX_AMOUNT`] each, the total capped at
//! [`MAX_COUNT`] when debt is added): every value below 2^53, exact in Lua.

use std::collections::VecDeque;

use super::{Window, MAX_COUNT};

/// One rolling window's state: the running total and the non-empty
/// sub-buckets, oldest first (ids strictly increasing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rolling {
    total: u64,
    subs: VecDeque<(u64, u64)>,
}

/// `(g, n, c)`: sub-bucket length, sub-buckets per window and the current
/// sub-bucket at `now`. Only called with rolling windows.
fn shape(window: Window, now: u64) -> (u64, u64, u64) {
    let (g, n) = window.rolling().unwrap_or((1, 1));
    (g, n, now / g)
}

impl Rolling {
    /// Drops the sub-buckets that have left the count at `now`.
    pub fn advance(&mut self, window: Window, now: u64) {
        let (_, n, c) = shape(window, now);
        while let Some(&(b, a)) = self.subs.front() {
            if b + n >= c {
                break;
            }
            self.total -= a;
            self.subs.pop_front();
        }
    }

    /// The state brought to `now` ([`Self::advance`]).
    pub fn at(&self, window: Window, now: u64) -> Rolling {
        let mut r = self.clone();
        r.advance(window, now);
        r
    }

    /// Units counted (call [`Self::advance`] first).
    pub fn used(&self) -> u64 {
        self.total
    }

    /// Units counted at `now`, without dropping what has left (a read).
    pub fn used_at(&self, window: Window, now: u64) -> u64 {
        let (_, n, c) = shape(window, now);
        let gone: u64 = self
            .subs
            .iter()
            .take_while(|(b, _)| b + n < c)
            .map(|(_, a)| a)
            .sum();
        self.total - gone
    }

    /// The state from its sub-buckets (`(id, amount)`, oldest first), as
    /// [`Self::parts`] gave them (a snapshot read back).
    pub fn from_parts(subs: Vec<(u64, u64)>) -> Rolling {
        let mut subs = subs;
        subs.sort_by_key(|(b, _)| *b);
        subs.dedup_by(|a, b| {
            let same = a.0 == b.0;
            if same {
                b.1 += a.1;
            }
            same
        });
        let mut r = Rolling::default();
        for (b, a) in subs {
            let a = a.min(MAX_COUNT - r.total);
            r.total += a;
            r.subs.push_back((b, a));
        }
        r
    }

    /// The sub-buckets, `(id, amount)`, oldest first.
    pub fn parts(&self) -> Vec<(u64, u64)> {
        self.subs.iter().copied().collect()
    }

    /// True when nothing is counted.
    pub fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }

    /// Non-empty sub-buckets kept (for the bytes per budget).
    pub fn len(&self) -> usize {
        self.subs.len()
    }

    /// Adds `amount` to the sub-bucket of `now`, the total capped at
    /// [`MAX_COUNT`] (debt beyond it is forgiven, as a calendar quota's);
    /// returns the sub-bucket id (what a hold records of the debit).
    pub fn debit(&mut self, window: Window, now: u64, amount: u64) -> u64 {
        let (_, _, c) = shape(window, now);
        let amount = amount.min(MAX_COUNT.saturating_sub(self.total));
        self.total += amount;
        match self.subs.back_mut() {
            Some((b, a)) if *b == c => *a += amount,
            _ => self.subs.push_back((c, amount)),
        }
        c
    }

    /// Gives back up to `amount` to sub-bucket `sub` (nothing when it has
    /// left; never more than it holds); returns what went back.
    pub fn credit(&mut self, sub: u64, amount: u64) -> u64 {
        for (b, a) in self.subs.iter_mut().rev() {
            if *b == sub {
                let r = amount.min(*a);
                *a -= r;
                self.total -= r;
                return r;
            }
            if *b < sub {
                break;
            }
        }
        0
    }

    /// Refunds `amount` of a hold whose debits were `debits` (`(sub-bucket,
    /// amount)`, in order), newest first, each at most its own amount;
    /// sub-buckets that have left at `now` get nothing (advance first).
    pub fn refund(&mut self, window: Window, now: u64, debits: &[(u64, u64)], amount: u64) {
        let (_, n, c) = shape(window, now);
        let mut left = amount;
        for &(b, a) in debits.iter().rev() {
            if left == 0 {
                break;
            }
            if b + n < c {
                continue;
            }
            let r = left.min(a);
            self.credit(b, r);
            left -= r;
        }
    }

    /// µs from `now` until `need` units have left the count (0 when
    /// `need` ≤ 0): the instant the oldest sub-buckets holding that much
    /// leave (sub-buckets that have left by `now` are skipped).
    pub fn wait_for(&self, window: Window, now: u64, need: i64) -> u64 {
        if need <= 0 {
            return 0;
        }
        let (g, n, c) = shape(window, now);
        let mut gone = 0u64;
        for &(b, a) in self.subs.iter().skip_while(|(b, _)| b + n < c) {
            gone += a;
            if gone as i64 >= need {
                return ((b + n + 1) * g).saturating_sub(now);
            }
        }
        self.until_empty(window, now)
    }

    /// The oldest units still counted at `now`: µs until their sub-bucket
    /// slides out and how many they are (`None` when empty).
    pub fn next_slide(&self, window: Window, now: u64) -> Option<(u64, u64)> {
        let (g, n, c) = shape(window, now);
        self.subs
            .iter()
            .find(|&&(b, a)| b + n >= c && a > 0)
            .map(|&(b, a)| (((b + n + 1) * g).saturating_sub(now), a))
    }

    /// µs from `now` until every unit has left the count (0 when empty):
    /// what a quota's reset means here.
    pub fn until_empty(&self, window: Window, now: u64) -> u64 {
        let (g, n, _) = shape(window, now);
        self.subs
            .back()
            .map_or(0, |&(b, _)| ((b + n + 1) * g).saturating_sub(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const G: u64 = 300_000_000;
    const W: u64 = 60 * G;
    const START: u64 = 1_000 * W + 12_345;

    /// One admission of the exact log: time, sub-bucket, net units.
    #[derive(Debug, Clone)]
    struct Logged {
        at: u64,
        sub: u64,
        net: u64,
    }

    fn exact(log: &[Logged], t: u64) -> u64 {
        log.iter()
            .filter(|l| l.at + W > t && l.at <= t)
            .map(|l| l.net)
            .sum()
    }

    /// The exact log's wait until `cost` fits (no traffic meanwhile).
    fn exact_wait(log: &[Logged], t: u64, cost: u64, limit: u64) -> u64 {
        let mut live: Vec<&Logged> = log.iter().filter(|l| l.at + W > t).collect();
        live.sort_by_key(|l| l.at);
        let mut count: u64 = live.iter().map(|l| l.net).sum();
        if count + cost <= limit {
            return 0;
        }
        for l in live {
            count -= l.net;
            if count + cost <= limit {
                return l.at + W - t;
            }
        }
        unreachable!("cost ≤ limit fits an empty window")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Random traffic over a random clock against an exact log: never
        /// over the limit in any interval of the window's length, the count
        /// is exactly the log's plus the oldest sub-bucket's early part,
        /// and every retry hint lies in [exact, exact + one sub-bucket].
        #[test]
        fn never_over_admits_and_refuses_early_within_one_sub_bucket(
            limit in 1u64..2_000,
            ops in prop::collection::vec(
                (0u64..3 * G, 0u8..12, 1u64..2_000, any::<prop::sample::Index>(), 0u64..100),
                1..300,
            ),
        ) {
            let window = Window::Hours5;
            let mut r = Rolling::default();
            let mut log: Vec<Logged> = Vec::new();
            // Which log entry each recorded debit belongs to.
            let mut t = START;
            for (step, jump, cost, pick, share) in ops {
                t += if jump == 0 { step * 20 } else { step };
                r.advance(window, t);
                let c = t / G;
                let early: u64 = log
                    .iter()
                    .filter(|l| l.sub + 60 == c && l.at + W <= t)
                    .map(|l| l.net)
                    .sum();
                prop_assert_eq!(r.used(), exact(&log, t) + early);
                if jump == 1 && !log.is_empty() {
                    // A refund of part of an earlier admission.
                    let i = pick.index(log.len());
                    let back = log[i].net * share / 100;
                    r.refund(window, t, &[(log[i].sub, back)], back);
                    log[i].net -= back;
                    continue;
                }
                let cost = cost.min(limit);
                if r.used() + cost <= limit {
                    let sub = r.debit(window, t, cost);
                    log.push(Logged { at: t, sub, net: cost });
                    // Every interval of length W ending now.
                    prop_assert!(exact(&log, t) <= limit);
                } else {
                    let need = (r.used() + cost - limit) as i64;
                    let wait = r.wait_for(window, t, need);
                    let truth = exact_wait(&log, t, cost, limit);
                    prop_assert!(wait >= truth, "hint {wait} before the exact {truth}");
                    prop_assert!(wait <= truth + G, "hint {wait} > exact {truth} + g");
                    // Admitted at the hint, not a µs before.
                    prop_assert!(r.at(window, t + wait).used() + cost <= limit);
                    prop_assert!(r.at(window, t + wait - 1).used() + cost > limit);
                }
            }
            // Every interval of length W, at the end (refunds included).
            for l in &log {
                prop_assert!(exact(&log, l.at) <= limit);
            }
        }
    }

    #[test]
    fn the_next_slide_is_the_oldest_sub_bucket_still_counted() {
        let w = Window::Hours5;
        let mut r = Rolling::default();
        assert_eq!(r.next_slide(w, START), None);
        r.debit(w, START, 7);
        r.debit(w, START + 3 * G, 5);
        // START's sub-bucket slides out 61 sub-buckets after its start.
        let out = (START / G + 61) * G;
        assert_eq!(r.next_slide(w, START + G), Some((out - START - G, 7)));
        // Once it has, the next one.
        assert_eq!(r.next_slide(w, out), Some((out + 3 * G - out, 5)));
        assert_eq!(r.next_slide(w, out + 3 * G), None);
    }

    #[test]
    fn a_sub_bucket_leaves_when_it_lies_wholly_beyond_the_window() {
        let w = Window::Hours5;
        let mut r = Rolling::default();
        let t0 = START - START % G + 7;
        r.debit(w, t0, 10);
        let leaves = (t0 / G + 61) * G;
        assert_eq!(r.at(w, leaves - 1).used(), 10);
        assert_eq!(r.at(w, leaves).used(), 0);
        assert_eq!(r.wait_for(w, t0, 1), leaves - t0);
        assert_eq!(r.until_empty(w, t0), leaves - t0);
        // Refunds go to their own sub-bucket only, never below zero.
        r.debit(w, t0 + G, 5);
        r.refund(w, t0 + G, &[(t0 / G, 10)], 20);
        assert_eq!(r.used(), 5);
        assert_eq!(r.credit(t0 / G + 1, 9), 5);
        assert_eq!(r.used(), 0);
    }
}
