//! Exact token counts of short delta texts, remembered per thread.
//!
//! Providers stream about one token per delta, and a stream's tokens repeat
//! (Zipf: a few hundred words make most of any text). When the relay must
//! count deltas exactly (near a reservation or the cap it enforces), a
//! short delta it has counted before costs a hash look-up instead of a run
//! of the tokenizer's regex and merges (callgrind measured 17,000
//! instructions for a 30-byte string). The key is the text itself, not a
//! digest: the count is the tokenizer's for exactly that text. The memo
//! is bounded: it forgets everything when full.

use std::cell::RefCell;

use crate::config::estimate::Encoding;

/// Texts longer than this are counted, not remembered.
pub const MAX_REMEMBERED_BYTES: usize = 32;

/// Entries per encoding before the memo forgets them all.
pub const MAX_ENTRIES: usize = 8192;

type Memo = foldhash::HashMap<Box<str>, u32>;

thread_local! {
    static MEMO: RefCell<[Memo; 2]> = RefCell::new(Default::default());
}

/// `encoding.count(text)`, remembered for short texts.
pub fn count(encoding: Encoding, text: &str) -> u64 {
    if text.is_empty() || text.len() > MAX_REMEMBERED_BYTES {
        return encoding.count(text);
    }
    let slot = match encoding {
        Encoding::O200kBase => 0,
        Encoding::Cl100kBase => 1,
    };
    MEMO.with(|memo| {
        if let Some(&n) = memo.borrow()[slot].get(text) {
            return u64::from(n);
        }
        let n = encoding.count(text);
        let mut memo = memo.borrow_mut();
        let map = &mut memo[slot];
        if map.len() >= MAX_ENTRIES {
            map.clear();
        }
        // At most 32 bytes: at most 32 tokens, which a u32 holds.
        map.insert(text.into(), n as u32);
        n
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_counts_are_the_tokenizers() {
        for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
            for t in [" the", "日本", "🙂🙂", " supercalifragilistic", "\u{0}"] {
                assert_eq!(count(enc, t), enc.count(t));
                assert_eq!(count(enc, t), enc.count(t), "second look-up");
            }
            let long = "word ".repeat(20);
            assert_eq!(count(enc, &long), enc.count(&long));
        }
        for i in 0..(MAX_ENTRIES + 10) {
            let t = format!("{i}x");
            assert_eq!(
                count(Encoding::O200kBase, &t),
                Encoding::O200kBase.count(&t)
            );
        }
    }
}
