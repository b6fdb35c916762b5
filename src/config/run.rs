//! Run budgets (docs/API.md "Runs", DESIGN "Run budgets"): the limits of
//! one run, as the `x-budgetgate-run-limits` header and the tenant
//! settings `run_limits_max` / `run_limits_default` write them, and what
//! a tenant says about runs.
//!
//! One grammar for the header and the settings: comma-separated
//! `name=value` fields, each at most once, spaces around them ignored:
//! `tokens=<n>` (input + output tokens), `usd=<decimal dollars>` (at most
//! six decimals), `requests=<n>`, `window=5h|24h|7d` (`1d` and `week`
//! are accepted for `24h` and `7d`). Every field is optional. A window is
//! one of the rolling quota windows (`budget::rolling`): a run's limit
//! holds over the last 5 hours, 24 hours or 7 days of the run, 24 hours
//! when none is named.

use std::time::Duration;

use crate::config::bounds::MAX_QUOTA;
use crate::money::{parse_usd, UsdError, MAX_SPEND};

/// Longest limits text accepted (header or setting), bytes.
pub const MAX_LIMITS_BYTES: usize = 256;

/// Longest run id accepted, bytes.
pub const MAX_RUN_ID_BYTES: usize = 128;

/// The rolling window a run's limits hold over (admission maps it onto
/// the quota windows of `budget::rolling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunWindow {
    /// The last 5 hours.
    Hours5,
    /// The last 24 hours.
    Hours24,
    /// The last 7 days.
    Week,
}

/// The window of a run whose limits name none.
pub const DEFAULT_WINDOW: RunWindow = RunWindow::Hours24;

/// How long a run's record lives after its last request when `run_ttl`
/// is not set.
pub const DEFAULT_TTL: Duration = Duration::from_secs(86_400);

/// Longest `run_ttl` accepted (31 days).
pub const MAX_TTL: Duration = Duration::from_secs(31 * 86_400);

/// The limits of a run (every field optional).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunLimits {
    /// Tokens (input + output) per window.
    pub tokens: Option<u64>,
    /// Micro-dollars per window.
    pub usd_micros: Option<u64>,
    /// Requests per window.
    pub requests: Option<u64>,
    /// The window; `None`: [`DEFAULT_WINDOW`] (or the default's).
    pub window: Option<RunWindow>,
}

impl RunLimits {
    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        *self == RunLimits::default()
    }

    /// The window the limits hold over.
    pub fn window(&self) -> RunWindow {
        self.window.unwrap_or(DEFAULT_WINDOW)
    }

    /// The limits in the grammar they are written in (`tokens=1000, usd=5.00`).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = self.tokens {
            parts.push(format!("tokens={t}"));
        }
        if let Some(u) = self.usd_micros {
            parts.push(format!("usd={}", crate::money::format_usd(u as i64)));
        }
        if let Some(r) = self.requests {
            parts.push(format!("requests={r}"));
        }
        if let Some(w) = self.window {
            parts.push(format!("window={}", window_name(w)));
        }
        parts.join(", ")
    }

    /// The limits as one word without spaces (what a run's record holds:
    /// two starts agree only when every field does).
    pub fn word(&self) -> String {
        let n = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        format!(
            "t={},u={},r={},w={}",
            n(self.tokens),
            n(self.usd_micros),
            n(self.requests),
            window_name(self.window())
        )
    }

    /// The limits a run's record holds (its [`RunLimits::word`], then the
    /// end user's field, which is skipped); `None` when it is not such a word.
    pub fn from_word(word: &str) -> Option<RunLimits> {
        let mut out = RunLimits::default();
        let n = |v: &str| match v {
            "-" => Some(None),
            v => v.parse::<u64>().ok().map(Some),
        };
        for field in word.split(',') {
            let (name, v) = field.split_once('=')?;
            match name {
                "t" => out.tokens = n(v)?,
                "u" => out.usd_micros = n(v)?,
                "r" => out.requests = n(v)?,
                "w" => {
                    out.window = Some(match v {
                        "5h" => RunWindow::Hours5,
                        "24h" => RunWindow::Hours24,
                        "7d" => RunWindow::Week,
                        _ => return None,
                    })
                }
                _ => {}
            }
        }
        Some(out)
    }

    /// The effective limits of a run whose request states `asked` (`None`:
    /// no limits header): each field the request's, else `default`'s;
    /// every field `max` sets is at most its value (an absent one takes
    /// it). `Err` names the first field above `max`.
    pub fn resolve(
        asked: Option<&RunLimits>,
        default: &RunLimits,
        max: &RunLimits,
    ) -> Result<RunLimits, &'static str> {
        let a = asked.copied().unwrap_or_default();
        let mut out = RunLimits {
            tokens: a.tokens.or(default.tokens),
            usd_micros: a.usd_micros.or(default.usd_micros),
            requests: a.requests.or(default.requests),
            window: Some(a.window.or(default.window).unwrap_or(DEFAULT_WINDOW)),
        };
        for (name, v, m) in [
            ("tokens", &mut out.tokens, max.tokens),
            ("usd", &mut out.usd_micros, max.usd_micros),
            ("requests", &mut out.requests, max.requests),
        ] {
            match (*v, m) {
                (Some(x), Some(m)) if x > m => return Err(name),
                (None, Some(m)) => *v = Some(m),
                _ => {}
            }
        }
        Ok(out)
    }
}

/// How the grammar writes a window.
pub fn window_name(w: RunWindow) -> &'static str {
    match w {
        RunWindow::Hours5 => "5h",
        RunWindow::Week => "7d",
        _ => "24h",
    }
}

/// Reads limits text (the header's or a setting's). `Err` says what is
/// wrong, naming the field.
pub fn parse(text: &str) -> Result<RunLimits, String> {
    if text.len() > MAX_LIMITS_BYTES {
        return Err(format!(
            "is {} bytes long; at most {MAX_LIMITS_BYTES} are accepted",
            text.len()
        ));
    }
    let mut out = RunLimits::default();
    let mut seen: [bool; 4] = [false; 4];
    for field in text.split(',') {
        let field = field.trim_matches([' ', '\t']);
        let Some((name, value)) = field.split_once('=') else {
            return Err(format!(
                "field {field:?} is not `name=value` (tokens, usd, requests, window)"
            ));
        };
        let (name, value) = (
            name.trim_matches([' ', '\t']),
            value.trim_matches([' ', '\t']),
        );
        let i = match name {
            "tokens" => 0,
            "usd" => 1,
            "requests" => 2,
            "window" => 3,
            other => {
                return Err(format!(
                    "unknown field `{}` (known: tokens, usd, requests, window)",
                    other.chars().take(32).collect::<String>()
                ))
            }
        };
        if std::mem::replace(&mut seen[i], true) {
            return Err(format!("field `{name}` is given twice"));
        }
        match i {
            0 => out.tokens = Some(count(name, value)?),
            1 => {
                let micros = parse_usd(value, MAX_SPEND).map_err(|e| match e {
                    UsdError::Syntax => {
                        format!("`usd` must be decimal dollars (e.g. 2.50), not {value:?}")
                    }
                    UsdError::Decimals(_) => "`usd` has more than six decimals".to_string(),
                    UsdError::Above => format!(
                        "`usd` must be at most {}",
                        crate::money::format_usd(MAX_SPEND as i64)
                    ),
                })?;
                if micros == 0 {
                    return Err("`usd` must be > 0".into());
                }
                out.usd_micros = Some(micros);
            }
            2 => out.requests = Some(count(name, value)?),
            _ => {
                out.window = Some(match value {
                    "5h" => RunWindow::Hours5,
                    "24h" | "1d" => RunWindow::Hours24,
                    "7d" | "week" => RunWindow::Week,
                    other => {
                        return Err(format!(
                            "`window` must be 5h, 24h or 7d, not {:?}",
                            other.chars().take(32).collect::<String>()
                        ))
                    }
                })
            }
        }
    }
    Ok(out)
}

/// A whole number of tokens or requests, 1 ..= [`MAX_QUOTA`].
fn count(name: &str, value: &str) -> Result<u64, String> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{name}` must be a whole number, not {value:?}"));
    }
    match value.parse::<u64>() {
        Ok(0) => Err(format!("`{name}` must be > 0")),
        Ok(n) if n <= MAX_QUOTA => Ok(n),
        _ => Err(format!("`{name}` must be at most {MAX_QUOTA}")),
    }
}

/// True for a run id the gateway accepts: 1 ..= [`MAX_RUN_ID_BYTES`]
/// bytes of `[A-Za-z0-9._:-]`.
pub fn is_valid_run_id(id: &[u8]) -> bool {
    !id.is_empty()
        && id.len() <= MAX_RUN_ID_BYTES
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// Reads `run_ttl`: a whole number followed by `s`, `m`, `h` or `d`
/// (`"24h"`, `"90m"`), 1 s ..= [`MAX_TTL`].
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let unit = text.chars().last().unwrap_or(' ');
    let n = &text[..text.len() - unit.len_utf8().min(text.len())];
    let per = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3_600,
        'd' => 86_400,
        _ => {
            return Err(format!(
                "must be a number of s, m, h or d (\"24h\"), not {text:?}"
            ))
        }
    };
    let n: u64 = n
        .parse()
        .map_err(|_| format!("must be a number of s, m, h or d (\"24h\"), not {text:?}"))?;
    let secs = n.saturating_mul(per);
    if secs == 0 || secs > MAX_TTL.as_secs() {
        return Err(format!("must be 1s to {}d", MAX_TTL.as_secs() / 86_400));
    }
    Ok(Duration::from_secs(secs))
}

/// What a tenant (with its ancestors' settings) says about runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSettings {
    /// `run_limits_max`: the ceiling of a run's limits (empty: none).
    pub max: RunLimits,
    /// `run_limits_default`: what a run without the limits header gets.
    pub default: RunLimits,
    /// `run_required`: a request without a run header is refused.
    pub required: bool,
    /// `runs_per_day`: runs each key may start per UTC day.
    pub runs_per_day: Option<u64>,
    /// `run_ttl`: how long a run's record lives after its last request.
    pub ttl: Duration,
}

impl Default for RunSettings {
    fn default() -> Self {
        Self {
            max: RunLimits::default(),
            default: RunLimits::default(),
            required: false,
            runs_per_day: None,
            ttl: DEFAULT_TTL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_records_word_reads_back_as_its_limits() {
        for text in [
            "tokens=200000, usd=2.00, requests=500, window=7d",
            "usd=0.5, window=5h",
            "requests=3",
        ] {
            let l = RunLimits::resolve(
                Some(&parse(text).unwrap()),
                &RunLimits::default(),
                &RunLimits::default(),
            )
            .unwrap();
            let word = format!("{},e=ab12", l.word());
            assert_eq!(RunLimits::from_word(&word), Some(l), "{word}");
        }
        assert_eq!(RunLimits::from_word("t=x,w=24h"), None);
        assert_eq!(RunLimits::from_word("t=1,w=1h"), None);
    }

    #[test]
    fn the_grammar_reads_every_field_and_names_what_is_wrong() {
        let l = parse("tokens=200000, usd=2.00, requests=500, window=24h").unwrap();
        assert_eq!(
            l,
            RunLimits {
                tokens: Some(200_000),
                usd_micros: Some(2_000_000),
                requests: Some(500),
                window: Some(RunWindow::Hours24),
            }
        );
        assert_eq!(
            parse(" window = 7d ").unwrap().window,
            Some(RunWindow::Week)
        );
        assert_eq!(parse("window=week").unwrap().window(), RunWindow::Week);
        assert_eq!(parse("tokens=5").unwrap().window(), RunWindow::Hours24);
        for (bad, says) in [
            ("tokens=1,tokens=2", "twice"),
            ("tokenz=1", "unknown field `tokenz`"),
            ("tokens=-1", "whole number"),
            ("tokens=0", "> 0"),
            ("tokens=1.5", "whole number"),
            ("usd=1.1234567", "six decimals"),
            ("usd=abc", "decimal dollars"),
            ("window=1h", "5h, 24h or 7d"),
            ("tokens", "name=value"),
            ("", "name=value"),
            ("tokens=1,", "name=value"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        let long = format!("tokens=1{}", " ".repeat(300));
        assert!(parse(&long).unwrap_err().contains("at most 256"));
    }

    #[test]
    fn limits_resolve_under_the_default_and_the_ceiling() {
        let max = parse("tokens=1000, usd=5").unwrap();
        let default = parse("tokens=100, window=5h").unwrap();
        let got = RunLimits::resolve(None, &default, &max).unwrap();
        assert_eq!(got.tokens, Some(100));
        assert_eq!(
            got.usd_micros,
            Some(5_000_000),
            "an absent field takes the ceiling"
        );
        assert_eq!(got.window(), RunWindow::Hours5);
        let asked = parse("tokens=1001").unwrap();
        assert_eq!(
            RunLimits::resolve(Some(&asked), &default, &max),
            Err("tokens")
        );
        let asked = parse("requests=7, window=7d").unwrap();
        let got = RunLimits::resolve(Some(&asked), &default, &max).unwrap();
        assert_eq!((got.tokens, got.requests), (Some(100), Some(7)));
        assert_eq!(got.word(), "t=100,u=5000000,r=7,w=7d");
    }

    #[test]
    fn run_ids_and_ttls() {
        assert!(is_valid_run_id(b"job-7:step_2.a"));
        for bad in [&b""[..], b"a b", b"{x}", b"a/b", &[b'x'; 129][..]] {
            assert!(!is_valid_run_id(bad), "{bad:?}");
        }
        assert!(is_valid_run_id(&[b'x'; 128]));
        assert_eq!(parse_ttl("24h").unwrap(), Duration::from_secs(86_400));
        assert_eq!(parse_ttl("90s").unwrap(), Duration::from_secs(90));
        assert!(parse_ttl("0h").is_err());
        assert!(parse_ttl("32d").is_err());
        assert!(parse_ttl("h").is_err());
        assert!(parse_ttl("").is_err());
    }
}
