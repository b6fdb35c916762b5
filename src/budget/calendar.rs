//! Quota windows in pure integer math (mirrored by the Lua scripts): UTC
//! calendar days and months, and the rolling windows of
//! [`super::rolling`] (whose "window id" is the sub-bucket a debit goes
//! to), and the windows that start at a budget's first use (whose id is
//! the instant they started, read from the stored state:
//! [`Window::current`]). Days and months are counted from the Unix epoch; month boundaries
//! use the proleptic Gregorian calendar (days-from-civil conversion after
//! H. Hinnant, "chrono-Compatible Low-Level Date Algorithms").

/// Microseconds per UTC day.
pub const MICROS_PER_DAY: u64 = 86_400_000_000;

/// A quota window length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Window {
    /// A UTC calendar day.
    Day,
    /// A UTC calendar month.
    Month,
    /// The last 5 hours, rolling: 60 sub-buckets of 5 minutes.
    #[serde(rename = "5h")]
    Hours5,
    /// The last 24 hours, rolling: 96 sub-buckets of 15 minutes.
    #[serde(rename = "24h")]
    Hours24,
    /// The last 7 days, rolling: 168 sub-buckets of 1 hour.
    Week,
    /// 5 hours from the first use after the previous such window ended:
    /// one counter and the instant it started (a subscription's session).
    #[serde(rename = "5h_from_first_use")]
    FirstUse5h,
    /// 24 hours from the first use, as [`Window::FirstUse5h`].
    #[serde(rename = "24h_from_first_use")]
    FirstUse24h,
    /// 7 days from the first use, as [`Window::FirstUse5h`].
    #[serde(rename = "week_from_first_use")]
    FirstUseWeek,
}

/// Microseconds per minute.
const MINUTE: u64 = 60_000_000;

impl Window {
    /// `(sub-bucket length µs, sub-buckets per window)` of a rolling
    /// window; `None` for the calendar ones.
    pub const fn rolling(self) -> Option<(u64, u64)> {
        match self {
            Window::Day
            | Window::Month
            | Window::FirstUse5h
            | Window::FirstUse24h
            | Window::FirstUseWeek => None,
            Window::Hours5 => Some((5 * MINUTE, 60)),
            Window::Hours24 => Some((15 * MINUTE, 96)),
            Window::Week => Some((60 * MINUTE, 168)),
        }
    }

    /// True for the rolling windows.
    pub const fn is_rolling(self) -> bool {
        self.rolling().is_some()
    }

    /// Length (µs) of a window that starts at its first use; `None` for
    /// the others.
    pub const fn from_first_use(self) -> Option<u64> {
        match self {
            Window::FirstUse5h => Some(5 * 60 * MINUTE),
            Window::FirstUse24h => Some(24 * 60 * MINUTE),
            Window::FirstUseWeek => Some(7 * 24 * 60 * MINUTE),
            _ => None,
        }
    }

    /// The window in force at `now` as `(id, end)`, given the stored
    /// counter's window id if any. A calendar or rolling window's is
    /// [`Window::id`] and [`Window::end`] of `now`; a window from first
    /// use (id = the instant it started, µs) keeps the stored one until it
    /// ends, after which a use at `now` starts a new one: so a debit, a
    /// refund and a lease name the window they belong to exactly as a
    /// calendar one's do.
    pub fn current(self, stored: Option<u64>, now: u64) -> (u64, u64) {
        match (self.from_first_use(), stored) {
            (Some(len), Some(id)) if now < id.saturating_add(len) => (id, id + len),
            (Some(len), _) => (now, now.saturating_add(len)),
            (None, _) => (self.id(now), self.end(now)),
        }
    }
    /// Identifier of the window containing `now` (UTC µs): days since the
    /// epoch for [`Window::Day`], `year × 12 + month − 1` for
    /// [`Window::Month`]; for a rolling window the sub-bucket `now` lies in
    /// (`now / sub-bucket length`), which is what a hold records of a debit
    /// and what a quota lease is valid in. For a window from first use, the
    /// id a window started at `now` would have (`now`): the one in force
    /// depends on the stored state ([`Window::current`]).
    pub fn id(self, now: u64) -> u64 {
        if let Some((sub, _)) = self.rolling() {
            return now / sub;
        }
        if self.from_first_use().is_some() {
            return now;
        }
        let day = now / MICROS_PER_DAY;
        match self {
            Window::Day => day,
            _ => {
                let (y, m, _) = civil_from_days(day as i64);
                (y as u64) * 12 + (m as u64 - 1)
            }
        }
    }

    /// Start of the window containing `now`, UTC µs (of a rolling window:
    /// `now` less the window's length, the start of the interval counted).
    pub fn start(self, now: u64) -> u64 {
        let day = now / MICROS_PER_DAY;
        match self {
            Window::Day => day * MICROS_PER_DAY,
            Window::Month => {
                let (y, m, _) = civil_from_days(day as i64);
                days_from_civil(y, m, 1) as u64 * MICROS_PER_DAY
            }
            Window::Hours5
            | Window::Hours24
            | Window::Week
            | Window::FirstUse5h
            | Window::FirstUse24h
            | Window::FirstUseWeek => now.saturating_sub(self.seconds() * 1_000_000),
        }
    }

    /// End of the window containing `now` (exclusive), UTC µs; of a
    /// rolling window, the end of the sub-bucket `now` lies in (where
    /// [`Window::id`] changes); of a window from first use, the end of one
    /// started at `now`.
    pub fn end(self, now: u64) -> u64 {
        if let Some((sub, _)) = self.rolling() {
            return (now / sub + 1) * sub;
        }
        if let Some(len) = self.from_first_use() {
            return now.saturating_add(len);
        }
        let day = now / MICROS_PER_DAY;
        match self {
            Window::Day => (day + 1) * MICROS_PER_DAY,
            _ => {
                let (y, m, _) = civil_from_days(day as i64);
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                days_from_civil(ny, nm, 1) as u64 * MICROS_PER_DAY
            }
        }
    }

    /// Window length in seconds, as written in the `w` parameter of the
    /// IETF `RateLimit-Policy` field (a month is written as 30 days).
    pub fn seconds(self) -> u64 {
        match self {
            Window::Day => 86_400,
            Window::Month => 30 * 86_400,
            Window::Hours5 | Window::FirstUse5h => 5 * 3_600,
            Window::Hours24 | Window::FirstUse24h => 86_400,
            Window::Week | Window::FirstUseWeek => 7 * 86_400,
        }
    }
}

/// `(year, month 1..=12, day 1..=31)` of a day count since 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Days since 1970-01-01 of a civil date.
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn month_end_handles_leap_february_and_december() {
        // 2028-02-10 → ends 2028-03-01
        let feb10 = days_from_civil(2028, 2, 10) as u64 * MICROS_PER_DAY;
        assert_eq!(
            Window::Month.end(feb10),
            days_from_civil(2028, 3, 1) as u64 * MICROS_PER_DAY
        );
        let dec31 = days_from_civil(2026, 12, 31) as u64 * MICROS_PER_DAY + 5;
        assert_eq!(
            Window::Month.end(dec31),
            days_from_civil(2027, 1, 1) as u64 * MICROS_PER_DAY
        );
        assert_eq!(
            Window::Month.id(dec31) + 1,
            Window::Month.id(Window::Month.end(dec31))
        );
    }

    #[test]
    fn round_trips_civil_dates() {
        for z in [-1000i64, 0, 1, 59, 365, 20_000, 20_787] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
    }

    #[test]
    fn a_window_from_first_use_holds_until_its_end_then_restarts_at_the_next_use() {
        let h = 3_600_000_000u64;
        let w = Window::FirstUse5h;
        assert_eq!(w.current(None, 7), (7, 7 + 5 * h));
        assert_eq!(w.current(Some(7), 7 + 5 * h - 1), (7, 7 + 5 * h));
        let later = 7 + 5 * h;
        assert_eq!(w.current(Some(7), later), (later, later + 5 * h));
        // Calendar and rolling windows ignore the stored state.
        assert_eq!(Window::Day.current(Some(1), 5), (0, MICROS_PER_DAY));
    }

    #[test]
    fn day_boundary_is_exact() {
        let end = Window::Day.end(MICROS_PER_DAY - 1);
        assert_eq!(end, MICROS_PER_DAY);
        assert_ne!(
            Window::Day.id(MICROS_PER_DAY - 1),
            Window::Day.id(MICROS_PER_DAY)
        );
    }
}
