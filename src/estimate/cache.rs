//! A bounded cache of token counts keyed by content hash (issue 7).
//!
//! Clients resend the same large strings on every request: system prompts,
//! tool / function schemas, long few-shot examples. Tokenising them costs
//! about 50 ns per byte (tiktoken-rs runs at roughly 20 MB/s here), hashing
//! them about 0.5 ns per byte, so a repeated 32 KB system prompt costs
//! microseconds instead of milliseconds.
//!
//! * **Key**: the BLAKE3 digest of the text (truncated to 128 bits), its
//!   length in bytes, and the [`Encoding`]. BLAKE3 is a cryptographic hash:
//!   a client cannot craft a string that collides with another one to get a
//!   cheaper estimate. The text itself is not stored, so an entry is a few
//!   dozen bytes whatever the size of the string.
//! * **Bound**: a fixed number of entries ([`DEFAULT_CAPACITY`] for the
//!   process-wide cache), evicted with the CLOCK (second-chance)
//!   algorithm: an entry hit since the hand last passed survives one more
//!   round, so a hot system prompt outlives a stream of one-off user
//!   messages.
//! * **Concurrency**: one mutex held only for the map look-up or insert,
//!   never while tokenising; two requests counting the same new string at
//!   once both count it (same result), and one insert wins.
//! * Strings shorter than [`MIN_CACHED_BYTES`] are counted directly:
//!   tokenising them costs about as much as a look-up, and caching them
//!   would churn the cache with short unique user messages.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use super::Encoding;

/// Entries of the process-wide cache.
pub const DEFAULT_CAPACITY: usize = 4096;

/// Strings shorter than this (in bytes) bypass the cache.
pub const MIN_CACHED_BYTES: usize = 128;

/// The process-wide cache used by [`Encoding::count_cached`].
pub(crate) static GLOBAL: LazyLock<TokenCache> =
    LazyLock::new(|| TokenCache::new(DEFAULT_CAPACITY));

/// What identifies a string's token count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    digest: [u8; 16],
    len: u64,
    encoding: Encoding,
}

#[derive(Debug)]
struct Slot {
    key: Key,
    tokens: u64,
    referenced: bool,
}

#[derive(Debug, Default)]
struct Clock {
    index: HashMap<Key, usize>,
    slots: Vec<Slot>,
    hand: usize,
}

/// A bounded map from (content hash, length, encoding) to token count.
#[derive(Debug)]
pub struct TokenCache {
    capacity: usize,
    inner: Mutex<Clock>,
}

impl TokenCache {
    /// An empty cache holding at most `capacity` (≥ 1) entries.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        TokenCache {
            capacity,
            inner: Mutex::new(Clock {
                index: HashMap::with_capacity(capacity),
                slots: Vec::with_capacity(capacity),
                hand: 0,
            }),
        }
    }

    /// Number of entries held (never above the capacity).
    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }

    /// True when the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most entries it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Drops every entry.
    pub fn clear(&self) {
        let mut c = self.lock();
        c.index.clear();
        c.slots.clear();
        c.hand = 0;
    }

    /// Tokens of `text` under `encoding` (`encode_ordinary`), from the cache
    /// when this text was counted before; short strings are counted
    /// directly.
    pub fn count(&self, encoding: Encoding, text: &str) -> u64 {
        if text.len() < MIN_CACHED_BYTES {
            return encoding.count(text);
        }
        let key = Key {
            digest: digest(text),
            len: text.len() as u64,
            encoding,
        };
        if let Some(tokens) = self.get(&key) {
            return tokens;
        }
        let tokens = encoding.count(text);
        self.insert(key, tokens);
        tokens
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Clock> {
        // A panic while holding the lock cannot leave the map inconsistent
        // with the slots in a way that matters (worst case: a stale miss).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, key: &Key) -> Option<u64> {
        let mut c = self.lock();
        let i = *c.index.get(key)?;
        let slot = &mut c.slots[i];
        slot.referenced = true;
        Some(slot.tokens)
    }

    fn insert(&self, key: Key, tokens: u64) {
        let mut c = self.lock();
        if c.index.contains_key(&key) {
            return; // another thread counted it meanwhile
        }
        if c.slots.len() < self.capacity {
            let i = c.slots.len();
            c.slots.push(Slot {
                key,
                tokens,
                referenced: false,
            });
            c.index.insert(key, i);
            return;
        }
        // CLOCK: clear reference bits until an unreferenced slot comes up
        // (at most one full turn plus one step).
        let n = c.slots.len();
        loop {
            let h = c.hand;
            c.hand = (h + 1) % n;
            let slot = &mut c.slots[h];
            if slot.referenced {
                slot.referenced = false;
                continue;
            }
            let old = std::mem::replace(
                slot,
                Slot {
                    key,
                    tokens,
                    referenced: false,
                },
            );
            c.index.remove(&old.key);
            c.index.insert(key, h);
            return;
        }
    }
}

fn digest(text: &str) -> [u8; 16] {
    let h = blake3::hash(text.as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.as_bytes()[..16]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts() -> Vec<String> {
        let mut v: Vec<String> = vec![
            String::new(),
            "hi".into(),
            "x".repeat(MIN_CACHED_BYTES - 1),
            "x".repeat(MIN_CACHED_BYTES),
            "<|endoftext|> is ordinary text here. ".repeat(40),
            "fn main() { println!(\"héllo wörld 🌍\"); }\n".repeat(100),
        ];
        for i in 0..50 {
            v.push(format!("You are assistant number {i}. ").repeat(10 + i));
        }
        v
    }

    #[test]
    fn cached_counts_equal_uncached_counts() {
        let cache = TokenCache::new(16);
        for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
            for round in 0..3 {
                for t in texts() {
                    assert_eq!(
                        cache.count(enc, &t),
                        enc.count(&t),
                        "round {round}, {enc:?}, {} bytes",
                        t.len()
                    );
                }
            }
        }
    }

    #[test]
    fn encoding_is_part_of_the_key() {
        let cache = TokenCache::new(16);
        let t = "Ünïcödé text with emoji 🎉🎉 and code {\"a\": [1, 2, 3]} ".repeat(20);
        let a = cache.count(Encoding::O200kBase, &t);
        let b = cache.count(Encoding::Cl100kBase, &t);
        assert_eq!(a, Encoding::O200kBase.count(&t));
        assert_eq!(b, Encoding::Cl100kBase.count(&t));
        assert_ne!(a, b, "the two encodings should count this text differently");
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn stays_bounded() {
        let cache = TokenCache::new(8);
        for i in 0..200 {
            let t = format!("distinct prompt {i} ").repeat(20);
            assert_eq!(
                cache.count(Encoding::O200kBase, &t),
                Encoding::O200kBase.count(&t)
            );
            assert!(cache.len() <= 8, "len {} after {i}", cache.len());
        }
        assert_eq!(cache.len(), 8);
        assert_eq!(cache.lock().index.len(), 8, "index and slots agree");
        // Short strings never enter it.
        cache.clear();
        cache.count(Encoding::O200kBase, "short");
        assert!(cache.is_empty());
    }

    #[test]
    fn a_hot_entry_survives_one_off_strings() {
        let cache = TokenCache::new(8);
        let system = "You are a careful assistant. ".repeat(50);
        let key = Key {
            digest: digest(&system),
            len: system.len() as u64,
            encoding: Encoding::O200kBase,
        };
        cache.count(Encoding::O200kBase, &system);
        for i in 0..100 {
            // Every request: the system prompt (a hit) and a new user message.
            cache.count(Encoding::O200kBase, &system);
            cache.count(
                Encoding::O200kBase,
                &format!("user question {i} ").repeat(10),
            );
            assert!(cache.get(&key).is_some(), "system prompt evicted at {i}");
        }
    }
}
