//! Wire encodings: the arguments the scripts read (binary spec numbers,
//! the hold's live and admission text, kind triples, budget meta) and the
//! flat string replies they answer.

use crate::budget::{
    BudgetKind, BudgetName, BudgetSpec, BudgetState, Denial, Scope, StoreError, Window,
};

use super::batch::ScriptArgs;

pub(super) fn protocol(what: impl std::fmt::Display) -> StoreError {
    StoreError::Protocol(what.to_string())
}

/// The numbers `lua/reserve.lua` reads of each spec, as one string: per
/// spec kind (1 bucket, 2 quota, 3 concurrency), a, b, cost and shadow (1
/// or 0), each an f64 in little-endian order (`struct.pack('<d')`; every
/// value is an integer below 2^53, exact as a double). One `struct.unpack`
/// in the script reads them all: cheaper in Redis than five decimal strings
/// per spec, each interned as a Lua string and converted by `tonumber`.
/// `costs` are the specs' costs in the same order (common ones as the first
/// candidate costs them).
pub(super) fn spec_numbers(specs: &[&BudgetSpec], costs: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(specs.len() * 40);
    for (spec, cost) in specs.iter().zip(costs) {
        let (kind, a, b) = match spec.kind {
            BudgetKind::Bucket { per_minute, burst } => (1, per_minute, burst),
            BudgetKind::Quota { limit, window } => (2, limit, window_number(window)),
            BudgetKind::Concurrency { max } => (3, max, 0),
        };
        for x in [kind, a, b, *cost, u64::from(spec.shadow)] {
            out.extend_from_slice(&(x as f64).to_le_bytes());
        }
    }
    out
}

/// Integers as packed little-endian doubles (the scripts' per-spec ARGV:
/// common costs per candidate, extension rates, settled actuals); every
/// value is below 2^53, exact as a double.
pub(super) fn packed(values: impl Iterator<Item = u64>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    for v in values {
        out.extend_from_slice(&(v as f64).to_le_bytes());
    }
    out
}

/// The spec's live entry of the hold (layout in `lua/lib.lua`) without its
/// line index and position, which the script prepends: `" B <ref> <a> <b> "`
/// (the script appends `"<amount>;"`), `" Q <ref> <a> <b> "` (the script
/// appends `"<window>:<amount>;"`), `" C 0 <max> 0 ;"`, or for a request
/// budget (rpm, requests per day, which extend and settle leave alone and
/// only a void settle refunds) `" b <ref> <a> <b> "` (the script appends
/// `"<cost>;"`) / `" q <ref> <a> <b> "` (the script appends
/// `"<window>:<cost>;"`).
/// Built with `push_str` and `itoa`: `format!` cost ~2k instructions per
/// argument on this path (callgrind).
pub(super) fn live_line(spec: &BudgetSpec) -> String {
    let refund = if spec.refund_unused { " 1 " } else { " 0 " };
    let mut out = String::with_capacity(48);
    let mut num = itoa::Buffer::new();
    match spec.kind {
        BudgetKind::Bucket { per_minute, burst } if !spec.name.counts_requests() => {
            out.push_str(" B");
            out.push_str(refund);
            out.push_str(num.format(per_minute));
            out.push(' ');
            out.push_str(num.format(burst));
            out.push(' ');
        }
        BudgetKind::Quota { limit, window } if !spec.name.counts_requests() => {
            out.push_str(" Q");
            out.push_str(refund);
            out.push_str(num.format(limit));
            out.push(' ');
            out.push_str(window_letter(window));
            out.push(' ');
        }
        BudgetKind::Concurrency { max } => {
            out.push_str(" C 0 ");
            out.push_str(num.format(max));
            out.push_str(" 0 ;");
        }
        // Request budgets: only a void settle refunds them (their cost is
        // appended by the script, like an amount budget's).
        BudgetKind::Bucket { per_minute, burst } => {
            out.push_str(" b");
            out.push_str(refund);
            out.push_str(num.format(per_minute));
            out.push(' ');
            out.push_str(num.format(burst));
            out.push(' ');
        }
        BudgetKind::Quota { limit, window } => {
            out.push_str(" q");
            out.push_str(refund);
            out.push_str(num.format(limit));
            out.push(' ');
            out.push_str(window_letter(window));
            out.push(' ');
        }
    }
    out
}

/// The first six adm fields of the spec in the hold (layout in
/// `lua/lib.lua`): kind, a, b, cost, refund flag and meta, tab-separated.
/// The script appends the remaining amount and reset time it computed.
pub(super) fn adm_fields(spec: &BudgetSpec, cost: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(96);
    let mut num = itoa::Buffer::new();
    let (kind, a, b) = match spec.kind {
        BudgetKind::Bucket { per_minute, burst } => ("B", per_minute, num.format(burst)),
        BudgetKind::Quota { limit, window } => ("Q", limit, window_letter(window)),
        BudgetKind::Concurrency { max } => ("C", max, "0"),
    };
    out.extend_from_slice(kind.as_bytes());
    out.push(b'\t');
    out.extend_from_slice(itoa::Buffer::new().format(a).as_bytes());
    out.push(b'\t');
    out.extend_from_slice(b.as_bytes());
    out.push(b'\t');
    out.extend_from_slice(itoa::Buffer::new().format(cost).as_bytes());
    out.extend_from_slice(if spec.refund_unused {
        b"\t1\t"
    } else {
        b"\t0\t"
    });
    write_meta(&mut out, spec);
    out
}

/// How the scripts' spec numbers name a quota window (`lua/lib.lua`'s `WL`).
pub(super) fn window_number(window: Window) -> u64 {
    match window {
        Window::Day => 0,
        Window::Month => 1,
        Window::Hours5 => 2,
        Window::Hours24 => 3,
        Window::Week => 4,
        Window::FirstUse5h => 5,
        Window::FirstUse24h => 6,
        Window::FirstUseWeek => 7,
    }
}

/// How the scripts' text (holds, inspect arguments) names a quota window:
/// the `ROLL` letters of the prelude for the rolling ones, the `FIRST`
/// letters (lower case) for the windows from first use.
pub(super) fn window_letter(window: Window) -> &'static str {
    match window {
        Window::Day => "D",
        Window::Month => "M",
        Window::Hours5 => "F",
        Window::Hours24 => "H",
        Window::Week => "W",
        Window::FirstUse5h => "f",
        Window::FirstUse24h => "h",
        Window::FirstUseWeek => "w",
    }
}

/// `kind, a, b` as the scripts expect them (see the ARGV of `lua/reserve.lua`),
/// numbers written straight into the command.
pub(super) fn push_kind(inv: &mut ScriptArgs, kind: &BudgetKind) {
    match *kind {
        BudgetKind::Bucket { per_minute, burst } => inv.arg("B").arg(per_minute).arg(burst),
        BudgetKind::Quota { limit, window } => inv.arg("Q").arg(limit).arg(window_letter(window)),
        BudgetKind::Concurrency { max } => inv.arg("C").arg(max).arg("0"),
    };
}

/// Scope and budget name as a JSON array, stored opaquely in the hold so a
/// gateway that did not create it can still name the budget that refused.
#[cfg(test)]
pub(super) fn meta_of(spec: &BudgetSpec) -> String {
    let mut out = Vec::with_capacity(64);
    write_meta(&mut out, spec);
    // Only JSON strings and punctuation were written: valid UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// Scope and budget name as a JSON array of strings (escaped by
/// serde_json), stored opaquely in the hold so a gateway that did not
/// create it can still name the budget that refused. Written straight into
/// `out`, with no intermediate vector or string: this runs for every budget
/// of every reservation.
fn write_meta(out: &mut Vec<u8>, spec: &BudgetSpec) {
    let (kind, a, b): (&str, &str, Option<&str>) = match &spec.scope {
        Scope::Tenant(t) => ("tenant", t, None),
        Scope::Key(t, k) => ("key", t, Some(k)),
        Scope::TenantModel(t, m) => ("tenant_model", t, Some(m)),
        Scope::Upstream(u) => ("upstream", u, None),
        Scope::EndUser(t, h) => ("end_user", t, Some(h)),
        Scope::Run(t, r) => ("run", t, Some(r)),
    };
    out.push(b'[');
    for (i, part) in [Some(kind), Some(a), b, Some(spec.name.as_str())]
        .into_iter()
        .flatten()
        .enumerate()
    {
        if i > 0 {
            out.push(b',');
        }
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, part);
    }
    out.push(b']');
}

pub(super) fn parse_meta(meta: &str) -> Result<(Scope, BudgetName), StoreError> {
    let parts: Vec<String> =
        serde_json::from_str(meta).map_err(|e| protocol(format!("hold meta {meta:?}: {e}")))?;
    let bad = || protocol(format!("hold meta {meta:?}"));
    let (name, scope) = parts.split_last().ok_or_else(bad)?;
    let scope = match scope {
        [k, t] if k == "tenant" => Scope::Tenant(t.as_str().into()),
        [k, t, key] if k == "key" => Scope::Key(t.as_str().into(), key.as_str().into()),
        [k, t, m] if k == "tenant_model" => {
            Scope::TenantModel(t.as_str().into(), m.as_str().into())
        }
        [k, u] if k == "upstream" => Scope::Upstream(u.as_str().into()),
        [k, t, h] if k == "end_user" => Scope::EndUser(t.as_str().into(), h.as_str().into()),
        [k, t, r] if k == "run" => Scope::Run(t.as_str().into(), r.as_str().into()),
        _ => return Err(bad()),
    };
    let name = BudgetName::parse(name).ok_or_else(bad)?;
    Ok((scope, name))
}

pub(super) fn window_of(kind: &BudgetKind) -> Option<Window> {
    match kind {
        BudgetKind::Quota { window, .. } => Some(*window),
        _ => None,
    }
}

/// A script reply: a flat array of strings read front to back.
pub(super) struct Reply<'a> {
    items: &'a [String],
    pos: usize,
}

impl<'a> Reply<'a> {
    pub(super) fn new(items: &'a [String]) -> Self {
        Self { items, pos: 0 }
    }

    pub(super) fn str(&mut self) -> Result<&'a str, StoreError> {
        let v = self
            .items
            .get(self.pos)
            .ok_or_else(|| protocol(format!("short reply {:?}", self.items)))?;
        self.pos += 1;
        Ok(v)
    }

    pub(super) fn u64(&mut self) -> Result<u64, StoreError> {
        let s = self.str()?;
        s.parse()
            .map_err(|_| protocol(format!("bad number {s:?} in reply")))
    }

    pub(super) fn i64(&mut self) -> Result<i64, StoreError> {
        let s = self.str()?;
        s.parse()
            .map_err(|_| protocol(format!("bad number {s:?} in reply")))
    }

    pub(super) fn usize(&mut self) -> Result<usize, StoreError> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| protocol(format!("index {v} out of range")))
    }

    pub(super) fn rest(&self) -> usize {
        self.items.len() - self.pos
    }
}

pub(super) fn state(spec: &BudgetSpec, remaining: i64, reset_micros: u64) -> BudgetState {
    BudgetState {
        scope: spec.scope.clone(),
        name: spec.name,
        limit: spec.limit(),
        remaining,
        reset_micros,
        window: window_of(&spec.kind),
    }
}

/// The inverse of [`push_kind`].
pub(super) fn parse_kind(kind: &str, a: u64, b: &str) -> Result<BudgetKind, StoreError> {
    Ok(match kind {
        "B" => BudgetKind::Bucket {
            per_minute: a,
            burst: b
                .parse()
                .map_err(|_| protocol(format!("bad burst {b:?}")))?,
        },
        "Q" => BudgetKind::Quota {
            limit: a,
            window: match b {
                "D" => Window::Day,
                "M" => Window::Month,
                "F" => Window::Hours5,
                "H" => Window::Hours24,
                "W" => Window::Week,
                "f" => Window::FirstUse5h,
                "h" => Window::FirstUse24h,
                "w" => Window::FirstUseWeek,
                w => return Err(protocol(format!("bad window {w:?}"))),
            },
        },
        "C" => BudgetKind::Concurrency { max: a },
        k => return Err(protocol(format!("bad budget kind {k:?}"))),
    })
}

/// Reads `available, retry_after, reset` of a refusing `spec` into a [`Denial`].
pub(super) fn denial(
    r: &mut Reply<'_>,
    spec: &BudgetSpec,
    requested: u64,
    now_micros: u64,
) -> Result<Denial, StoreError> {
    let available = r.i64()?;
    let retry_after_micros = r.u64()?;
    let reset = r.u64()?;
    Ok(Denial {
        held_for_share: false,
        scope: spec.scope.clone(),
        name: spec.name,
        limit: spec.limit(),
        requested,
        available,
        retry_after_micros,
        now_micros,
        state: state(spec, available, reset),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::keys::KeySpace;

    #[test]
    fn meta_round_trips_every_scope() {
        let ks = KeySpace::new("bg", "d");
        for scope in [
            Scope::Tenant("acme".into()),
            Scope::Key("acme".into(), "batch".into()),
            Scope::TenantModel("acme".into(), "meta/llama:3".into()),
            Scope::Upstream("azure \"east\"".into()),
            Scope::Run("acme".into(), "job:7".into()),
        ] {
            let spec = BudgetSpec {
                key: ks.budget(&scope, BudgetName::TokensPerDay).into(),
                scope: scope.clone(),
                name: BudgetName::TokensPerDay,
                kind: BudgetKind::Quota {
                    limit: 5,
                    window: Window::Day,
                },
                refund_unused: true,
                shadow: false,
            };
            assert_eq!(
                parse_meta(&meta_of(&spec)).unwrap(),
                (scope.clone(), BudgetName::TokensPerDay)
            );
            // The same text serde_json writes for the parts as an array
            // (what holds written by earlier versions contain).
            let parts: Vec<String> = match &scope {
                Scope::Tenant(t) => vec!["tenant".into(), t.to_string()],
                Scope::Key(t, k) => vec!["key".into(), t.to_string(), k.to_string()],
                Scope::TenantModel(t, m) => {
                    vec!["tenant_model".into(), t.to_string(), m.to_string()]
                }
                Scope::Upstream(u) => vec!["upstream".into(), u.to_string()],
                Scope::EndUser(t, h) => vec!["end_user".into(), t.to_string(), h.to_string()],
                Scope::Run(t, r) => vec!["run".into(), t.to_string(), r.to_string()],
            };
            let mut parts = parts;
            parts.push("tokens_per_day".into());
            assert_eq!(meta_of(&spec), serde_json::to_string(&parts).unwrap());
        }
    }

    /// The static hold text the gateway renders for `lua/reserve.lua`, in the
    /// exact layout of `lua/lib.lua` (the Lua side only prepends the line
    /// index, appends a quota's window and tokens, and the remaining/reset).
    #[test]
    fn hold_text_of_each_kind_of_spec() {
        let ks = KeySpace::new("bg", "d");
        let spec = |name: BudgetName, kind: BudgetKind, refund_unused: bool| BudgetSpec {
            key: ks.budget(&Scope::Tenant("t".into()), name).into(),
            scope: Scope::Tenant("t".into()),
            name,
            kind,
            refund_unused,
            shadow: false,
        };
        let tpm = spec(
            BudgetName::Tpm,
            BudgetKind::Bucket {
                per_minute: 1000,
                burst: 1500,
            },
            true,
        );
        let rpm = spec(
            BudgetName::Rpm,
            BudgetKind::Bucket {
                per_minute: 60,
                burst: 60,
            },
            false,
        );
        let month = spec(
            BudgetName::TokensPerMonth,
            BudgetKind::Quota {
                limit: 9000000000,
                window: Window::Month,
            },
            false,
        );
        let slots = spec(
            BudgetName::MaxConcurrent,
            BudgetKind::Concurrency { max: 4 },
            true,
        );
        assert_eq!(live_line(&tpm), " B 1 1000 1500 ");
        assert_eq!(
            live_line(&rpm),
            " b 0 60 60 ",
            "a request budget's entry: refunded by a void settle only"
        );
        assert_eq!(live_line(&month), " Q 0 9000000000 M ");
        assert_eq!(live_line(&slots), " C 0 4 0 ;");
        let adm = |s: &BudgetSpec| String::from_utf8(adm_fields(s, s.cost(77))).unwrap();
        assert_eq!(
            adm(&tpm),
            "B\t1000\t1500\t77\t1\t[\"tenant\",\"t\",\"tpm\"]"
        );
        assert_eq!(adm(&rpm), "B\t60\t60\t1\t0\t[\"tenant\",\"t\",\"rpm\"]");
        assert_eq!(
            adm(&month),
            "Q\t9000000000\tM\t77\t0\t[\"tenant\",\"t\",\"tokens_per_month\"]"
        );
        assert_eq!(
            adm(&slots),
            "C\t4\t0\t1\t1\t[\"tenant\",\"t\",\"max_concurrent\"]"
        );
        let nums = spec_numbers(&[&tpm, &month, &slots], &[77, 77, 1]);
        let got: Vec<f64> = nums
            .chunks(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(
            got,
            [1.0, 1000.0, 1500.0, 77.0, 0.0, 2.0, 9e9, 1.0, 77.0, 0.0, 3.0, 4.0, 0.0, 1.0, 0.0]
        );
    }
}
