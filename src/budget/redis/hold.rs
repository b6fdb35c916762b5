//! The stored hold record: what one reservation debited where, as the
//! scripts write it (layout in `lua/lib.lua`), decoded for the store, the
//! admin API and tests.

use std::collections::HashMap;

use crate::budget::{BudgetSpec, StoreError, WouldDeny};

use super::wire::{parse_kind, parse_meta, protocol};

/// A hold as stored in Redis: what one reservation debited where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldRecord {
    /// Reservation id.
    pub id: String,
    /// Store time of the admission, UTC µs.
    pub admitted_micros: u64,
    /// Logical expiry, UTC µs (the key's TTL adds a margin).
    pub expires_micros: u64,
    /// Concurrency lease, µs.
    pub slot_lease_micros: u64,
    /// Tokens reserved, initial + extensions.
    pub reserved_tokens: u64,
    /// Index of the chosen candidate deployment.
    pub candidate: usize,
    /// One line per budget debited, in order (common, then the candidate's).
    pub lines: Vec<HoldLine>,
    /// Shadow budgets that would have refused the admission (not debited).
    pub would_deny: Vec<WouldDeny>,
    /// Extensions as `(store time µs, tokens granted)`.
    pub extensions: Vec<(u64, u64)>,
    /// Set once settled (or voided).
    pub settlement: Option<HoldSettlement>,
    /// Voided (settle mode void, or a void tombstone for an id that had no
    /// hold): a reserve of the id writes nothing and answers `Voided`.
    pub voided: bool,
}

/// One budget of a hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldLine {
    /// The budget, with the policy it was reserved under. Its `key` is empty
    /// once the hold is settled (the tombstone keeps no keys).
    pub spec: BudgetSpec,
    /// What the reservation debited from it, in its unit.
    pub cost: u64,
    /// What it holds now in its unit, reservation and extensions (0 for
    /// concurrency and once settled).
    pub held: u64,
    /// Quota debits as `(window id, amount)`, reservation and extensions
    /// (what settle refunds from; a request quota's only by a void); empty
    /// for other budgets and once settled.
    pub quota_debits: Vec<(u64, u64)>,
    /// `(remaining, reset µs)` answered at admission (buckets and quotas).
    pub admitted: Option<(i64, u64)>,
}

/// The settle applied to a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldSettlement {
    /// Store time of the settle, UTC µs.
    pub now_micros: u64,
    /// Tokens refunded to refundable budgets.
    pub refunded: u64,
    /// Tokens charged as debt.
    pub debt: u64,
}

fn hold_num<T: std::str::FromStr>(s: Option<&str>, what: &str) -> Result<T, StoreError> {
    s.and_then(|s| s.parse().ok())
        .ok_or_else(|| protocol(format!("hold field {what} missing or not a number")))
}

/// `"a:b a:b"`-style pairs (`sep` between pairs).
fn hold_pairs(s: &str, sep: char, what: &str) -> Result<Vec<(u64, u64)>, StoreError> {
    s.split(sep)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (a, b) = p
                .split_once(':')
                .ok_or_else(|| protocol(format!("hold field {what}: bad pair {p:?}")))?;
            Ok((hold_num(Some(a), what)?, hold_num(Some(b), what)?))
        })
        .collect()
}

impl HoldRecord {
    /// Decodes the text the scripts store (layout v2, see `lua/lib.lua`):
    /// header, keys, live entries, extensions, admission, id, one per line.
    pub fn parse(raw: &str) -> Result<Self, StoreError> {
        let mut sections = raw.splitn(6, '\n');
        let mut section = |what: &str| {
            sections
                .next()
                .ok_or_else(|| protocol(format!("hold: no {what} section")))
        };
        let header = section("header")?;
        let keys = section("keys")?;
        let live = section("live")?;
        let ext = section("ext")?;
        let adm = section("adm")?;
        let id = section("id")?;

        let mut h = header.split(' ');
        let (settled, voided) = match h.next() {
            Some("0") => (false, false),
            Some("1") => (true, false),
            Some("2") => (true, true),
            other => return Err(protocol(format!("hold: bad state {other:?}"))),
        };
        let expires_micros = hold_num(h.next(), "exp")?;
        let reserved_tokens = hold_num(h.next(), "res")?;
        let slot_lease_micros = hold_num(h.next(), "lease")?;
        let admitted_micros = hold_num(h.next(), "now")?;
        let candidate = hold_num(h.next(), "cand")?;
        let settlement = HoldSettlement {
            now_micros: hold_num(h.next(), "snow")?,
            refunded: hold_num(h.next(), "refunded")?,
            debt: hold_num(h.next(), "debt")?,
        };

        // Quota debits and amounts held by 1-based line index, from the
        // live entries.
        let mut debits: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
        let mut held: HashMap<usize, u64> = HashMap::new();
        for entry in live.split(';').filter(|e| !e.is_empty()) {
            let f: Vec<&str> = entry.splitn(7, ' ').collect();
            if f.len() != 7 {
                return Err(protocol(format!("hold: bad live entry {entry:?}")));
            }
            let line: usize = hold_num(Some(f[0]), "line")?;
            match f[2] {
                "Q" | "q" => {
                    let d = hold_pairs(f[6], ',', "d")?;
                    held.insert(line, d.iter().map(|(_, a)| a).sum());
                    debits.insert(line, d);
                }
                "B" | "b" => {
                    held.insert(line, hold_num(Some(f[6]), "d")?);
                }
                _ => {}
            }
        }

        let mut a = adm.split('\t');
        let n_would_deny: usize = hold_num(a.next(), "adm")?;
        let mut would_deny = Vec::with_capacity(n_would_deny);
        for _ in 0..n_would_deny {
            let (scope, name) = parse_meta(a.next().ok_or_else(|| protocol("hold: short adm"))?)?;
            would_deny.push(WouldDeny { scope, name });
        }
        let fields: Vec<&str> = a.collect();
        if !fields.len().is_multiple_of(8) {
            return Err(protocol(format!("hold: adm has {} fields", fields.len())));
        }
        let keys: Vec<&str> = keys.split(' ').filter(|k| !k.is_empty()).collect();
        if !settled && keys.len() != fields.len() / 8 {
            return Err(protocol(format!(
                "hold: {} keys for {} lines",
                keys.len(),
                fields.len() / 8
            )));
        }
        let mut lines = Vec::with_capacity(fields.len() / 8);
        for (j, f) in fields.chunks(8).enumerate() {
            let kind = parse_kind(f[0], hold_num(Some(f[1]), "a")?, f[2])?;
            let (scope, name) = parse_meta(f[5])?;
            let admitted = if f[0] == "C" {
                None
            } else {
                Some((hold_num(Some(f[6]), "rem")?, hold_num(Some(f[7]), "reset")?))
            };
            lines.push(HoldLine {
                spec: BudgetSpec {
                    scope,
                    name,
                    kind,
                    key: keys
                        .get(j)
                        .map_or_else(|| "".into(), |k| std::sync::Arc::<str>::from(&k[..])),
                    refund_unused: f[4] == "1",
                    shadow: false,
                },
                cost: hold_num(Some(f[3]), "cost")?,
                held: held.remove(&(j + 1)).unwrap_or_default(),
                quota_debits: debits.remove(&(j + 1)).unwrap_or_default(),
                admitted,
            });
        }
        Ok(HoldRecord {
            id: id.to_string(),
            admitted_micros,
            expires_micros,
            slot_lease_micros,
            reserved_tokens,
            candidate,
            lines,
            would_deny,
            extensions: hold_pairs(ext, ' ', "ext")?,
            settlement: settled.then_some(settlement),
            voided,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_hold_and_tombstone_parse() {
        let h = HoldRecord::parse("0 9 7 3 5 0 0 0 0\n\n\n\n0\nr1").unwrap();
        assert!(h.lines.is_empty() && h.extensions.is_empty() && h.settlement.is_none());
        assert_eq!(
            (h.id.as_str(), h.reserved_tokens, h.expires_micros),
            ("r1", 7, 9)
        );
        let raw = "1 9 7 3 5 1 6 2 0\n\n\n6:4\n1\t[\"tenant\",\"t\",\"tpm\"]\t\
                   B\t100\t100\t3\t1\t[\"tenant\",\"t\",\"tpm\"]\t97\t1800\t\
                   C\t2\t0\t1\t1\t[\"tenant\",\"t\",\"max_concurrent\"]\t\t\nid\nwith newline";
        let h = HoldRecord::parse(raw).unwrap();
        assert_eq!(h.id, "id\nwith newline");
        assert_eq!(h.extensions, vec![(6, 4)]);
        assert_eq!(h.would_deny.len(), 1);
        assert_eq!(h.lines.len(), 2);
        assert_eq!(h.lines[0].admitted, Some((97, 1800)));
        assert_eq!(h.lines[0].cost, 3);
        assert!(h.lines[0].spec.key.is_empty() && h.lines[1].admitted.is_none());
        assert_eq!(
            h.settlement,
            Some(HoldSettlement {
                now_micros: 6,
                refunded: 2,
                debt: 0
            })
        );
    }
}
