//! A bounded cache of token counts keyed by content hash.
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
//! * **Two partitions** of [`DEFAULT_CAPACITY`] entries each: strings of
//!   at least [`MIN_CACHED_BYTES`] (system prompts, schemas) and shorter
//!   ones (chat turns, which clients resend with the whole history on every
//!   turn). Counting a 30-byte string still runs the tokenizer's regex
//!   machinery, about 17,000 instructions against about 1,000 for a hash
//!   and look-up (callgrind), so short strings are cached too; in
//!   their own partition, so a stream of unique short user messages cannot
//!   evict a long system prompt.

use foldhash::HashMap;
use std::cell::Cell;
use std::sync::{LazyLock, Mutex};

use crate::config::estimate::Encoding;

/// Entries of each partition of the process-wide cache.
pub const DEFAULT_CAPACITY: usize = 4096;

/// Strings of at least this many bytes go to the long-string partition.
pub const MIN_CACHED_BYTES: usize = 128;

/// The process-wide cache used by [`Encoding::count_cached`].
pub(crate) static GLOBAL: LazyLock<TokenCache> =
    LazyLock::new(|| TokenCache::new(DEFAULT_CAPACITY));

thread_local! {
    /// Set by [`uncached`]: this thread's counts skip the cache.
    static BYPASS: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every [`Encoding::count_cached`] on this thread counted
/// by the tokenizer, the cache neither read nor filled: the reference an
/// estimate through the cache is checked against (the cache must never
/// change a figure), and a cold count without emptying a cache other
/// threads share.
pub fn uncached<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            BYPASS.with(|b| b.set(self.0));
        }
    }
    let _restore = Restore(BYPASS.with(|b| b.replace(true)));
    f()
}

/// Whether this thread is inside [`uncached`].
pub(crate) fn bypassed() -> bool {
    BYPASS.with(Cell::get)
}

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
    /// Strings of at least [`MIN_CACHED_BYTES`].
    long: Mutex<Clock>,
    /// Non-empty strings below [`MIN_CACHED_BYTES`].
    short: Mutex<Clock>,
}

impl TokenCache {
    /// An empty cache holding at most `capacity` (≥ 1) entries in each
    /// partition.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let clock = || {
            Mutex::new(Clock {
                index: HashMap::default(),
                slots: Vec::new(),
                hand: 0,
            })
        };
        TokenCache {
            capacity,
            long: clock(),
            short: clock(),
        }
    }

    /// Number of entries held (never above twice the capacity).
    pub fn len(&self) -> usize {
        lock(&self.long).slots.len() + lock(&self.short).slots.len()
    }

    /// True when the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most entries each partition holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Drops every entry.
    pub fn clear(&self) {
        for part in [&self.long, &self.short] {
            let mut c = lock(part);
            c.index.clear();
            c.slots.clear();
            c.hand = 0;
        }
    }

    /// Tokens of `text` under `encoding` (`encode_ordinary`), from the cache
    /// when this text was counted before.
    pub fn count(&self, encoding: Encoding, text: &str) -> u64 {
        if text.is_empty() {
            return 0;
        }
        let part = if text.len() < MIN_CACHED_BYTES {
            &self.short
        } else {
            &self.long
        };
        let key = Key {
            digest: digest(text),
            len: text.len() as u64,
            encoding,
        };
        if let Some(tokens) = lock(part).get(&key) {
            return tokens;
        }
        let tokens = encoding.count(text);
        lock(part).insert(key, tokens, self.capacity);
        tokens
    }

    #[cfg(test)]
    fn get(&self, key: &Key) -> Option<u64> {
        let part = if key.len < MIN_CACHED_BYTES as u64 {
            &self.short
        } else {
            &self.long
        };
        lock(part).get(key)
    }
}

fn lock(m: &Mutex<Clock>) -> std::sync::MutexGuard<'_, Clock> {
    // A panic while holding the lock cannot leave the map inconsistent
    // with the slots in a way that matters (worst case: a stale miss).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Clock {
    fn get(&mut self, key: &Key) -> Option<u64> {
        let i = *self.index.get(key)?;
        let slot = &mut self.slots[i];
        slot.referenced = true;
        Some(slot.tokens)
    }

    fn insert(&mut self, key: Key, tokens: u64, capacity: usize) {
        if self.index.contains_key(&key) {
            return; // another thread counted it meanwhile
        }
        if self.slots.len() < capacity {
            let i = self.slots.len();
            self.slots.push(Slot {
                key,
                tokens,
                referenced: false,
            });
            self.index.insert(key, i);
            return;
        }
        // CLOCK: clear reference bits until an unreferenced slot comes up
        // (at most one full turn plus one step).
        let n = self.slots.len();
        loop {
            let h = self.hand;
            self.hand = (h + 1) % n;
            let slot = &mut self.slots[h];
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
            self.index.remove(&old.key);
            self.index.insert(key, h);
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
    fn an_uncached_count_neither_reads_nor_fills_the_process_wide_cache() {
        let text = format!(
            "a string no other test counts: {:?}",
            std::thread::current().id()
        )
        .repeat(8);
        let key = Key {
            digest: digest(&text),
            len: text.len() as u64,
            encoding: Encoding::O200kBase,
        };
        let counted = uncached(|| Encoding::O200kBase.count_cached(&text));
        assert_eq!(counted, Encoding::O200kBase.count(&text));
        assert!(GLOBAL.get(&key).is_none(), "the bypass filled the cache");
        assert!(!bypassed(), "the bypass ends with its closure");
        assert_eq!(Encoding::O200kBase.count_cached(&text), counted);
        assert_eq!(GLOBAL.get(&key), Some(counted));
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
        assert_eq!(lock(&cache.long).index.len(), 8, "index and slots agree");
        // Short strings have their own bounded partition.
        for i in 0..200 {
            cache.count(Encoding::O200kBase, &format!("short {i}"));
        }
        assert_eq!(cache.len(), 16);
        assert_eq!(lock(&cache.short).index.len(), 8);
    }

    #[test]
    fn unique_short_strings_never_evict_a_long_one() {
        let cache = TokenCache::new(4);
        let system = "You are a careful assistant. ".repeat(50);
        cache.count(Encoding::O200kBase, &system);
        for i in 0..1000 {
            cache.count(Encoding::O200kBase, &format!("question {i}"));
        }
        let key = Key {
            digest: digest(&system),
            len: system.len() as u64,
            encoding: Encoding::O200kBase,
        };
        assert!(cache.get(&key).is_some());
        // A repeated short string is served from the cache.
        let turn = Key {
            digest: digest("question 999"),
            len: 12,
            encoding: Encoding::O200kBase,
        };
        assert_eq!(
            cache.get(&turn),
            Some(Encoding::O200kBase.count("question 999"))
        );
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
