//! Metering a stream by a bound (DESIGN section 19): output the relay has not yet
//! tokenised, and the most tokens it can be.
//!
//! # The bound
//!
//! The exact count of a stream's output is the sum, over its deltas, of
//! each delta's tiktoken count (`encode_ordinary`), as the relay has
//! always counted it. For every encoding the gateway supports:
//!
//! * **`cl100k_base` and `o200k_base`: a delta of `b` UTF-8 bytes is at
//!   most `b` tokens.** Every token of these encodings stands for a
//!   non-empty byte string (the 256 single bytes and their merges; checked
//!   over the whole vocabulary by `every_token_is_at_least_one_byte`), and
//!   `encode_ordinary` cuts the text's UTF-8 bytes into tokens whose bytes,
//!   concatenated, are exactly the text's. So the tokens partition the
//!   bytes, each part at least one byte long. A character of several
//!   bytes (UTF-8 uses up to four) is at most that many tokens, whether
//!   it is one token, part of a merge, or split into single-byte
//!   "byte-fallback" tokens; the bound counts its bytes, never its
//!   characters, so it holds for every script and emoji.
//! * **Anthropic models** count `scale(t, ratio) = ⌈t × ratio / 1000⌉`
//!   of the summed tiktoken count `t` (`token_ratio` per mille, e.g. 1000
//!   or 1500). `scale` does not decrease as `t` grows, so with `t ≤ T`,
//!   `scale(t, ratio) ≤ scale(T, ratio)`: the bound is the exact raw count
//!   so far plus the pending bytes, scaled once (at 1500, 1.5 tokens a
//!   byte, rounded up once).
//!
//! # How the relay uses it
//!
//! Every decision the relay takes on a count compares it with a limit:
//! "has the output reached the reservation?" (then extend, or cut off)
//! and "has a choice passed the cap plus its tolerance?" (then cut off).
//! While the exact count so far plus the pending bytes (the bound) stays
//! below the limit, the exact count does too, and the decision is the one
//! an exact count would take, without tokenising. When the bound reaches
//! the limit, the pending deltas are counted exactly (each delta on its
//! own, as before, so the sum is the same), and the decision is taken on
//! that count; the deltas that follow are pending again, from that exact
//! count. Every delta is tokenised at most once, and only when a decision
//! or the settlement needs it (the upstream's usage settles most streams).

use super::delta_counts;
use crate::config::estimate::Encoding;

/// The most tokens `bytes` bytes of text can be under `encoding` (see the
/// module doc): one per byte for both encodings.
pub fn tokens_at_most(encoding: Encoding, bytes: u64) -> u64 {
    match encoding {
        Encoding::O200kBase | Encoding::Cl100kBase => bytes,
    }
}

/// One string of a delta kept for counting.
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// The choice the delta belongs to.
    choice: u64,
    /// Where the string ends in [`PendingOutput::text`].
    end: usize,
    /// The first string of its delta (a delta's strings count together).
    starts_delta: bool,
}

/// Deltas delivered and not yet tokenised: their text, per choice.
#[derive(Debug, Default)]
pub struct PendingOutput {
    text: String,
    pieces: Vec<Piece>,
    /// Pending bytes of each requested choice.
    choice_bytes: Vec<u64>,
    /// Pending bytes of every choice (an index out of range counts too).
    bytes: u64,
}

impl PendingOutput {
    /// Nothing pending, for a stream of `choices` choices.
    pub fn new(choices: usize) -> Self {
        Self {
            choice_bytes: vec![0; choices],
            ..Self::default()
        }
    }

    /// Keeps one delta of `choice`: its strings (content, arguments, names).
    pub fn push_delta<'s>(&mut self, choice: u64, strings: impl IntoIterator<Item = &'s str>) {
        let mut starts_delta = true;
        let mut added = 0u64;
        for s in strings {
            if s.is_empty() {
                continue; // no tokens, no bytes
            }
            self.text.push_str(s);
            self.pieces.push(Piece {
                choice,
                end: self.text.len(),
                starts_delta,
            });
            starts_delta = false;
            added += s.len() as u64;
        }
        self.bytes += added;
        if let Some(b) = usize::try_from(choice)
            .ok()
            .and_then(|i| self.choice_bytes.get_mut(i))
        {
            *b += added;
        }
    }

    /// Pending bytes, all choices.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Pending bytes of one requested choice (0 out of range).
    pub fn choice_bytes(&self, choice: u64) -> u64 {
        usize::try_from(choice)
            .ok()
            .and_then(|i| self.choice_bytes.get(i))
            .copied()
            .unwrap_or(0)
    }

    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Counts every pending delta exactly, in delivery order, calling
    /// `counted(choice, tokens)` once per delta; nothing is pending after.
    pub fn count(&mut self, encoding: Encoding, mut counted: impl FnMut(u64, u64)) {
        let mut start = 0;
        let mut delta: Option<(u64, u64)> = None;
        for p in &self.pieces {
            let tokens = delta_counts::count(encoding, &self.text[start..p.end]);
            start = p.end;
            delta = match delta {
                Some((choice, sum)) if !p.starts_delta => Some((choice, sum + tokens)),
                Some((choice, sum)) => {
                    counted(choice, sum);
                    Some((p.choice, tokens))
                }
                None => Some((p.choice, tokens)),
            };
        }
        if let Some((choice, sum)) = delta {
            counted(choice, sum);
        }
        self.text.clear();
        self.pieces.clear();
        self.choice_bytes.iter_mut().for_each(|b| *b = 0);
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The bound's premise: no token of either encoding decodes to nothing.
    #[test]
    fn every_token_is_at_least_one_byte() {
        for (enc, bpe) in [
            (Encoding::Cl100kBase, tiktoken_rs::cl100k_base_singleton()),
            (Encoding::O200kBase, tiktoken_rs::o200k_base_singleton()),
        ] {
            let mut tokens = 0u32;
            for rank in 0..210_000u32 {
                if let Ok(bytes) = bpe.decode_bytes(&[rank]) {
                    assert!(!bytes.is_empty(), "{enc}: token {rank} is empty");
                    tokens += 1;
                }
            }
            assert!(tokens > 100_000, "{enc}: {tokens} tokens decoded");
        }
    }

    proptest! {
        /// Any text, any script: never more tokens than bytes.
        #[test]
        fn tokens_never_exceed_the_bound(text in "\\PC{0,64}", raw in proptest::collection::vec(any::<u8>(), 0..48)) {
            let lossy = String::from_utf8_lossy(&raw).into_owned();
            for t in [text.as_str(), lossy.as_str()] {
                for enc in [Encoding::Cl100kBase, Encoding::O200kBase] {
                    prop_assert!(enc.count(t) <= tokens_at_most(enc, t.len() as u64));
                }
            }
        }
    }

    #[test]
    fn counts_each_delta_on_its_own_and_sums_its_strings() {
        let enc = Encoding::O200kBase;
        let mut p = PendingOutput::new(2);
        p.push_delta(0, ["hello", " world"]);
        p.push_delta(1, ["", "日本語"]);
        p.push_delta(7, ["🙂"]);
        assert_eq!(p.bytes(), 11 + 9 + 4);
        assert_eq!(p.choice_bytes(1), 9);
        assert_eq!(p.choice_bytes(7), 0);
        let mut seen = Vec::new();
        p.count(enc, |c, t| seen.push((c, t)));
        assert_eq!(
            seen,
            vec![
                (0, enc.count("hello") + enc.count(" world")),
                (1, enc.count("日本語")),
                (7, enc.count("🙂")),
            ]
        );
        assert!(p.is_empty());
        assert_eq!((p.bytes(), p.choice_bytes(0)), (0, 0));
    }
}
