//! Script assembly: each script's source is a prelude of the constants the
//! scripts share with Rust, written here from the Rust constants so the two
//! cannot drift, then `lua/lib.lua`, then its own file (and, for a call
//! sent alone, a one-line driver).
//!
//! A script is called with EVALSHA; when Redis does not have it (first
//! use, restart, `SCRIPT FLUSH`) the call is sent once more as EVAL with
//! the whole source, which also caches it. No `SCRIPT LOAD` is needed, so a
//! Redis user denied the `SCRIPT` command (managed services, proxies) works.

use std::sync::Arc;

use redis::Script;

use crate::budget::bucket::{DEBT_FLOOR, MAX_WAIT_MS, UNITS_PER_TOKEN};
use crate::budget::calendar::{Window, MICROS_PER_DAY};
use crate::budget::keys::LAYOUT_VERSION;
use crate::budget::share::{ACTIVE_MICROS, GAP_STEPS, SHARE_RETRY_MICROS};
use crate::budget::{MAX_AMOUNT, MAX_COUNT, RATE_ONE, RUN_INDEX_MAX};
use crate::config::bounds::MAX_LIMIT;

/// Every key's TTL gets this margin past the moment it stops mattering, so
/// a key is never dropped while its logical state still differs from
/// "absent" (milliseconds).
pub const TTL_MARGIN_MS: u64 = 60_000;

const LIB: &str = include_str!("../../../lua/lib.lua");
const RESERVE: &str = include_str!("../../../lua/reserve.lua");
const SETTLE: &str = include_str!("../../../lua/settle.lua");
const BATCH: &str = include_str!("../../../lua/batch.lua");
const EXTEND: &str = include_str!("../../../lua/extend.lua");
const RENEW: &str = include_str!("../../../lua/renew.lua");
const LOWER: &str = include_str!("../../../lua/lower.lua");
const INSPECT: &str = include_str!("../../../lua/inspect.lua");
const LEASE: &str = include_str!("../../../lua/lease.lua");
const SHARE: &str = include_str!("../../../lua/share.lua");

/// The Lua definitions of the constants shared with Rust.
pub fn prelude() -> String {
    format!(
        "-- Written by src/budget/redis/scripts.rs from the Rust constants.\n\
         local UNITS = {UNITS_PER_TOKEN}\n\
         local DAY = {MICROS_PER_DAY}\n\
         local MARGIN_MS = {TTL_MARGIN_MS}\n\
         local LAYOUT = {LAYOUT_VERSION}\n\
         local DEBT_FLOOR = {DEBT_FLOOR}\n\
         local MAX_WAIT_MS = {MAX_WAIT_MS}\n\
         local MAX_COST = {MAX_LIMIT}\n\
         local MAX_AMOUNT = {MAX_AMOUNT}\n\
         local RATE_ONE = {RATE_ONE}\n\
         local MAX_COUNT = {MAX_COUNT}\n\
         local SHARE_ACTIVE = {ACTIVE_MICROS}\n\
         local SHARE_GAP = {GAP_STEPS}\n\
         local SHARE_RETRY = {SHARE_RETRY_MICROS}\n\
         local RUN_INDEX_MAX = {RUN_INDEX_MAX}\n\
         local ROLL = {{ F = {{ {f_g}, {f_n} }}, H = {{ {h_g}, {h_n} }}, W = {{ {w_g}, {w_n} }} }}\n\
         local FIRST = {{ f = {first_5h}, h = {first_24h}, w = {first_week} }}\n",
        f_g = ROLL_5H.0,
        f_n = ROLL_5H.1,
        h_g = ROLL_24H.0,
        h_n = ROLL_24H.1,
        w_g = ROLL_WEEK.0,
        w_n = ROLL_WEEK.1,
        first_5h = first_use_length(Window::FirstUse5h),
        first_24h = first_use_length(Window::FirstUse24h),
        first_week = first_use_length(Window::FirstUseWeek),
    )
}

// Sub-bucket length (µs) and count of each rolling window, by the letter
// the scripts name it with (`wire::window_letter`): F 5 h, H 24 h, W week.
const ROLL_5H: (u64, u64) = rolling_shape(Window::Hours5);
const ROLL_24H: (u64, u64) = rolling_shape(Window::Hours24);
const ROLL_WEEK: (u64, u64) = rolling_shape(Window::Week);

// Length (µs) of each window from first use, by its letter: f 5 h, h 24 h,
// w week.
const fn first_use_length(w: Window) -> u64 {
    match w.from_first_use() {
        Some(len) => len,
        None => 0,
    }
}

const fn rolling_shape(w: Window) -> (u64, u64) {
    match w.rolling() {
        Some(shape) => shape,
        None => (1, 1),
    }
}

/// One script: its source and SHA1 (for EVALSHA).
#[derive(Clone)]
pub struct LuaScript {
    script: Script,
    source: Arc<str>,
}

impl LuaScript {
    fn assemble(parts: &[&str]) -> Self {
        let mut source = prelude();
        for part in parts {
            source.push_str(part);
            source.push('\n');
        }
        Self {
            script: Script::new(&source),
            source: source.into(),
        }
    }

    /// SHA1 of the source, hex.
    pub fn get_hash(&self) -> &str {
        self.script.get_hash()
    }

    /// The whole source, for EVAL.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The reserve script for a call sent alone (the same `reserve(KEYS,
    /// ARGV)` as in [`Self::batch`], without the batch driver).
    pub fn reserve() -> Self {
        Self::assemble(&[
            LIB,
            SHARE,
            RESERVE,
            "local reply = reserve(KEYS, ARGV)\nflush()\nreturn words(reply)",
        ])
    }

    /// The settle script for a call sent alone.
    pub fn settle() -> Self {
        Self::assemble(&[
            LIB,
            SETTLE,
            "local reply = settle(KEYS, ARGV)\nflush()\nreturn words(reply)",
        ])
    }

    /// The batch script: `reserve(KEYS, ARGV)`, `settle(KEYS, ARGV)` and
    /// the driver that runs a batch of them in order (see `batch.rs`).
    pub fn batch() -> Self {
        Self::assemble(&[LIB, SHARE, RESERVE, SETTLE, BATCH])
    }

    /// The extend script.
    pub fn extend() -> Self {
        Self::assemble(&[LIB, EXTEND])
    }

    /// The renew script.
    pub fn renew() -> Self {
        Self::assemble(&[LIB, RENEW])
    }

    /// The lower script.
    pub fn lower() -> Self {
        Self::assemble(&[LIB, LOWER])
    }

    /// The inspect script (read-only; with no keys, the readiness probe).
    pub fn inspect() -> Self {
        Self::assemble(&[LIB, INSPECT])
    }

    /// The quota-lease script (lines, and what is out on leases).
    pub fn lease() -> Self {
        Self::assemble(&[LIB, LEASE])
    }
}

/// The scripts called directly (reserve and settle go through the batcher).
pub(super) struct Scripts {
    pub(super) extend: LuaScript,
    pub(super) renew: LuaScript,
    pub(super) inspect: LuaScript,
    pub(super) lower: LuaScript,
    pub(super) lease: LuaScript,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Self {
            extend: LuaScript::extend(),
            renew: LuaScript::renew(),
            inspect: LuaScript::inspect(),
            lower: LuaScript::lower(),
            lease: LuaScript::lease(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_constants_lua_uses_come_from_rust_and_are_defined_nowhere_else() {
        let p = prelude();
        assert!(p.contains(&format!("local UNITS = {UNITS_PER_TOKEN}\n")));
        assert!(p.contains(&format!("local DAY = {MICROS_PER_DAY}\n")));
        for file in [
            LIB, SHARE, RESERVE, SETTLE, BATCH, EXTEND, RENEW, LOWER, INSPECT, LEASE,
        ] {
            for name in [
                "UNITS",
                "DAY",
                "MARGIN_MS",
                "LAYOUT",
                "DEBT_FLOOR",
                "MAX_WAIT_MS",
                "MAX_COST",
                "MAX_AMOUNT",
                "RATE_ONE",
                "MAX_COUNT",
                "SHARE_ACTIVE",
                "SHARE_GAP",
                "SHARE_RETRY",
                "RUN_INDEX_MAX",
            ] {
                assert!(
                    !file.contains(&format!("local {name} =")),
                    "{name} is defined in a Lua file; it must come from the prelude"
                );
            }
        }
        assert!(LuaScript::reserve().source().starts_with(&p));
    }
}
