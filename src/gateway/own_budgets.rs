//! The last answer of `GET /v1/budget` per key (the route is the HTTP
//! face's, [`crate::server::control_api::own_budget`]): the read costs a
//! store call and is not metered, so each key's answer is kept for at most
//! [`MAX_AGE_MICROS`] and a client polling in a loop costs the store at
//! most one read a second per key.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;

/// The oldest answer served from [`Answers`], µs.
pub const MAX_AGE_MICROS: u64 = 1_000_000;

/// One key's last answer.
pub struct Answer {
    /// UTC µs of its store read.
    pub at: u64,
    /// The policy it was read under: a reload's new limits show at once.
    pub policy_version: String,
    /// The answer's body.
    pub body: Value,
}

/// The last answer per (tenant, key id), at most one entry per key of the
/// policy: past that (keys deleted since), entries older than
/// [`MAX_AGE_MICROS`] go, and if none is, all do.
#[derive(Default)]
pub struct Answers {
    by_key: Mutex<HashMap<(String, String), Answer>>,
}

impl Answers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Answer>> {
        self.by_key.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The answer of `key` read under `version` at most [`MAX_AGE_MICROS`]
    /// before `now`, with its age.
    pub fn fresh(&self, key: &(String, String), version: &str, now: u64) -> Option<(Value, u64)> {
        let answers = self.lock();
        let a = answers.get(key)?;
        let age = now.checked_sub(a.at)?;
        (age <= MAX_AGE_MICROS && a.policy_version == version).then(|| (a.body.clone(), age))
    }

    /// Keeps `answer` of `key`; past one entry per key of the policy
    /// (`keys_in_policy`), the stale ones go first.
    pub fn keep(&self, key: (String, String), answer: Answer, keys_in_policy: usize) {
        let mut answers = self.lock();
        if !answers.contains_key(&key) && answers.len() >= keys_in_policy.max(1) {
            let now = answer.at;
            answers.retain(|_, a| now.saturating_sub(a.at) <= MAX_AGE_MICROS);
            if answers.len() >= keys_in_policy.max(1) {
                answers.clear();
            }
        }
        answers.insert(key, answer);
    }

    /// Answers kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// No answer kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
