//! How a settled reservation ended, as the place that made the settlement
//! names it (the settle phase, the relay's meter, the drop backstop), or
//! `Unknown` when the store never confirmed it.

/// How the reservation of a settlement ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream answered (a whole answer, or a stream that completed).
    Answered,
    /// A stream cut off by the gateway (budget, time limit, cap, shutdown)
    /// or ended by the client going away; what was delivered is charged.
    CutOff,
    /// The upstream failed (before any output: refunded; mid-stream: what
    /// was delivered is charged).
    UpstreamFailed,
    /// The request never reached the upstream: every budget refunded.
    Voided,
    /// The reservation was dropped unsettled (its handler cancelled before
    /// an answer was read): charged whole, the drop backstop.
    Abandoned,
    /// The store never confirmed the settlement within its retry window
    /// (a reply lost, the store down): either it applied (the row's
    /// figures were charged) or the hold expires charged whole.
    Unknown,
}

impl Outcome {
    /// The ledger column's (and the span attribute's) value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::CutOff => "cut_off",
            Outcome::UpstreamFailed => "upstream_failed",
            Outcome::Voided => "voided",
            Outcome::Abandoned => "abandoned",
            Outcome::Unknown => "unknown",
        }
    }

    /// The outcome a column value names.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "answered" => Outcome::Answered,
            "cut_off" => Outcome::CutOff,
            "upstream_failed" => Outcome::UpstreamFailed,
            "voided" => Outcome::Voided,
            "abandoned" => Outcome::Abandoned,
            "unknown" => Outcome::Unknown,
            _ => return None,
        })
    }
}
