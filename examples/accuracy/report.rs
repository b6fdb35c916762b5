//! One row of the table per scenario variant: two figures read from the
//! mock upstream's counters — (a) admitted, (b) spent — each against its
//! bound, plus any extra checks; the gateways' degraded decisions and store
//! errors (validity); the bursts' spread.

use super::procs::Health;

/// One figure against its bound.
#[derive(Clone, Debug)]
pub struct Check {
    pub what: String,
    pub value: u64,
    pub bound: f64,
    pub unit: &'static str,
    /// A floor, not a ceiling: the value must be at least the bound.
    pub at_least: bool,
}

impl Check {
    pub fn new(what: &str, value: u64, bound: f64, unit: &'static str) -> Check {
        Check {
            what: what.into(),
            value,
            bound,
            unit,
            at_least: false,
        }
    }

    /// `value` must be at least `floor`.
    pub fn at_least(what: &str, value: u64, floor: f64, unit: &'static str) -> Check {
        Check {
            at_least: true,
            ..Check::new(what, value, floor, unit)
        }
    }

    pub fn held(&self) -> bool {
        if self.at_least {
            self.value as f64 >= self.bound
        } else {
            self.value as f64 <= self.bound
        }
    }

    fn cell(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.value,
            self.unit,
            if self.at_least { "≥" } else { "≤" },
            if self.at_least {
                self.bound.ceil() as u64
            } else {
                self.bound.floor() as u64
            },
            if self.held() { "✓" } else { "✗" }
        )
    }
}

/// One scenario variant's result.
#[derive(Clone, Debug)]
pub struct Row {
    pub scenario: &'static str,
    pub variant: String,
    pub a: Check,
    pub b: Check,
    pub extra: Vec<Check>,
    /// The bounds, named (DESIGN sections, terms and their values).
    pub bound: String,
    pub health: Health,
    /// Degraded decisions are the point of the scenario (an outage).
    pub degraded_intended: bool,
    pub spread_ms: f64,
    pub window_ms: f64,
    pub notes: Vec<String>,
    /// Why the run is invalid (empty: valid).
    pub invalid: Vec<String>,
}

impl Row {
    pub fn new(scenario: &'static str, variant: String, a: Check, b: Check) -> Row {
        Row {
            scenario,
            variant,
            a,
            b,
            extra: Vec::new(),
            bound: String::new(),
            health: Health::default(),
            degraded_intended: false,
            spread_ms: 0.0,
            window_ms: 0.0,
            notes: Vec::new(),
            invalid: Vec::new(),
        }
    }

    /// The spreads and window of the scenario's bursts.
    pub fn set_burst(&mut self, b: &super::client::Burst) {
        self.spread_ms = b.spread_ms;
        self.window_ms = b.window_ms;
        let mut s = b.spreads.clone();
        s.sort_by(f64::total_cmp);
        if let (Some(min), Some(max)) = (s.first(), s.last()) {
            self.notes.push(format!(
                "{} burst(s), each written within {min:.1}–{max:.1} ms (median {:.1} ms) after its first byte",
                s.len(),
                s[s.len() / 2]
            ));
        }
    }

    pub fn valid(&self) -> bool {
        self.invalid.is_empty() && (self.degraded_intended || self.health.degraded == 0)
    }

    pub fn held(&self) -> bool {
        self.a.held() && self.b.held() && self.extra.iter().all(Check::held)
    }

    fn verdict(&self) -> &'static str {
        match (self.valid(), self.held()) {
            (false, _) => "INVALID",
            (true, true) => "within",
            (true, false) => "BROKEN",
        }
    }
}

/// A failed scenario run (setup error): reported, and fails the run.
pub fn failed(scenario: &'static str, variant: String, why: String) -> Row {
    let mut r = Row::new(
        scenario,
        variant,
        Check::new("-", 0, 0.0, ""),
        Check::new("-", 0, 0.0, ""),
    );
    r.invalid.push(why);
    r
}

/// The table (Markdown), then each row's bounds and notes.
pub fn print(rows: &[Row]) {
    println!(
        "| scenario | variant | (a) admitted | (b) spent | other checks | degraded (intended) | store errors | lease decisions | max spread ms | window s | verdict |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let extra: Vec<String> = r
            .extra
            .iter()
            .map(|c| format!("{}: {}", c.what, c.cell()))
            .collect();
        println!(
            "| {} | {} | {}: {} | {}: {} | {} | {} ({}) | {} | {} | {:.1} | {:.2} | {} |",
            r.scenario,
            r.variant,
            r.a.what,
            r.a.cell(),
            r.b.what,
            r.b.cell(),
            if extra.is_empty() {
                "—".to_string()
            } else {
                extra.join("; ")
            },
            r.health.degraded,
            if r.degraded_intended { "yes" } else { "no" },
            r.health.store_errors,
            r.health.lease_decisions,
            r.spread_ms,
            r.window_ms / 1e3,
            r.verdict()
        );
    }
    println!();
    for r in rows {
        println!("- {} / {}: {}", r.scenario, r.variant, r.bound);
        for n in &r.notes {
            println!("  - {n}");
        }
        for i in &r.invalid {
            println!("  - INVALID: {i}");
        }
        if !r.degraded_intended && r.health.degraded > 0 {
            println!(
                "  - INVALID: {} unintended degraded decisions",
                r.health.degraded
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(value: u64, bound: f64) -> Row {
        Row::new(
            "t",
            "v".into(),
            Check::new("a", value, bound, "tok"),
            Check::new("b", value, bound, "tok"),
        )
    }

    #[test]
    fn an_unintended_degraded_decision_makes_a_run_invalid_not_passed() {
        let mut r = row(10, 10.0);
        assert!(r.valid() && r.held());
        r.health.degraded = 1;
        assert!(!r.valid());
        assert_eq!(r.verdict(), "INVALID");
        r.degraded_intended = true;
        assert_eq!(r.verdict(), "within");
    }

    #[test]
    fn a_figure_past_its_bound_is_broken() {
        let r = row(11, 10.9);
        assert!(r.valid() && !r.held());
        assert_eq!(r.verdict(), "BROKEN");
        let mut r = row(5, 10.0);
        r.extra.push(Check::new("x", 3, 2.0, "req"));
        assert_eq!(r.verdict(), "BROKEN");
    }
}
