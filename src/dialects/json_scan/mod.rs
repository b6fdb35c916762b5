//! A forward-only reader of one JSON document for the few fields a
//! stream event's metering needs (the bound-first relay): a chat chunk's ~200 bytes
//! read field by field, the rest skipped, with no serde machinery (field
//! matching through visitors, `MapAccess` per member) between the bytes
//! and the strings.
//!
//! It is stricter than serde_json, never looser: everything it accepts
//! serde_json accepts and reads the same way (strings unescaped to the
//! same text, integers to the same value, raw values to the same span);
//! what it refuses (an exponent, a number of more than 20 digits, a lone
//! surrogate escape, nesting deeper than [`MAX_DEPTH`], a duplicated
//! field the caller reads) makes its caller read the event as a tree, by
//! serde_json's own rules. `chat_stream`'s tests check the reader against
//! serde's derive on generated chunks.

use std::borrow::Cow;

/// Deepest nesting read; deeper documents are left to serde_json (whose
/// own limit is 128).
pub const MAX_DEPTH: u32 = 64;

/// The reader: a position in `src`.
pub struct Scan<'a> {
    src: &'a str,
    at: usize,
    depth: u32,
}

impl<'a> Scan<'a> {
    /// A reader at the start of `src`.
    pub fn new(src: &'a str) -> Self {
        Self {
            src,
            at: 0,
            depth: 0,
        }
    }

    fn bytes(&self) -> &'a [u8] {
        self.src.as_bytes()
    }

    /// The next byte after whitespace, not consumed.
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        let b = self.bytes();
        while let Some(&c) = b.get(self.at) {
            if !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                return Some(c);
            }
            self.at += 1;
        }
        None
    }

    #[inline]
    fn eat(&mut self, want: u8) -> Option<()> {
        (self.peek()? == want).then(|| self.at += 1)
    }

    /// Nothing but whitespace is left.
    pub fn end(&mut self) -> Option<()> {
        self.peek().is_none().then_some(())
    }

    /// Consumes `null` if it comes next.
    pub fn null(&mut self) -> bool {
        if self.peek() == Some(b'n') && self.bytes()[self.at..].starts_with(b"null") {
            self.at += 4;
            true
        } else {
            false
        }
    }

    /// An object: `member(scan, key)` is called once per member and must
    /// consume its value. Inlined into each reader: its member closure is
    /// the reader, and the call would otherwise cost one per member.
    #[inline]
    pub fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, Cow<'a, str>) -> Option<()>,
    ) -> Option<()> {
        self.eat(b'{')?;
        self.nest()?;
        if self.peek()? == b'}' {
            self.at += 1;
        } else {
            loop {
                let key = self.string()?;
                self.eat(b':')?;
                member(self, key)?;
                match self.peek()? {
                    b',' => self.at += 1,
                    b'}' => {
                        self.at += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.depth -= 1;
        Some(())
    }

    /// An array: `element(scan)` is called once per element and must
    /// consume it.
    pub fn array(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        self.nest()?;
        if self.peek()? == b']' {
            self.at += 1;
        } else {
            loop {
                element(self)?;
                match self.peek()? {
                    b',' => self.at += 1,
                    b']' => {
                        self.at += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.depth -= 1;
        Some(())
    }

    fn nest(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }

    /// A string, borrowed unless it holds escapes.
    #[inline]
    pub fn string(&mut self) -> Option<Cow<'a, str>> {
        self.eat(b'"')?;
        let start = self.at;
        let end = special(self.bytes(), start)?;
        if self.bytes()[end] == b'"' {
            self.at = end + 1;
            return Some(Cow::Borrowed(self.src.get(start..end)?));
        }
        self.escaped(start, end)
    }

    /// The rest of a string whose plain run `start..i` ended at a
    /// backslash or a control character.
    #[cold]
    fn escaped(&mut self, start: usize, mut i: usize) -> Option<Cow<'a, str>> {
        let b = self.bytes();
        let mut out = String::with_capacity(i - start + 8);
        out.push_str(&self.src[start..i]);
        loop {
            match b[i] {
                b'"' => {
                    self.at = i + 1;
                    return Some(Cow::Owned(out));
                }
                b'\\' => {
                    let (c, len) = self.escape(i + 1)?;
                    out.push(c);
                    i += 1 + len;
                }
                _ => return None,
            }
            // The run up to the next special byte (all three are ASCII:
            // a UTF-8 boundary).
            let run = special(b, i)?;
            out.push_str(&self.src[i..run]);
            i = run;
        }
    }

    /// The escape after a backslash at `i`: its character and length.
    fn escape(&self, i: usize) -> Option<(char, usize)> {
        let b = self.bytes();
        let c = match *b.get(i)? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = hex4(b.get(i + 1..i + 5)?)?;
                return match hi {
                    0xD800..=0xDBFF => {
                        // A surrogate pair: `\uD83D\uDE00`.
                        if b.get(i + 5..i + 7)? != b"\\u" {
                            return None;
                        }
                        let lo = hex4(b.get(i + 7..i + 11)?)?;
                        if !(0xDC00..=0xDFFF).contains(&lo) {
                            return None;
                        }
                        let cp = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                        Some((char::from_u32(cp)?, 11))
                    }
                    0xDC00..=0xDFFF => None,
                    _ => Some((char::from_u32(hi)?, 5)),
                };
            }
            _ => return None,
        };
        Some((c, 1))
    }

    /// A non-negative integer that fits a `u64` (no fraction, no exponent).
    pub fn u64(&mut self) -> Option<u64> {
        self.peek()?;
        let (neg, digits) = self.integer()?;
        if neg {
            return None;
        }
        value(digits)
    }

    /// An integer that fits an `i64` (no fraction, no exponent).
    pub fn i64(&mut self) -> Option<i64> {
        self.peek()?;
        let (neg, digits) = self.integer()?;
        let v = value(digits)?;
        if neg {
            // Down to i64::MIN, whose magnitude is i64::MAX + 1.
            (v <= i64::MAX as u64 + 1).then(|| (v as i64).wrapping_neg())
        } else {
            i64::try_from(v).ok()
        }
    }

    /// `-?(0|[1-9][0-9]*)` not followed by a fraction or an exponent:
    /// (negative, digits).
    fn integer(&mut self) -> Option<(bool, &'a str)> {
        let b = self.bytes();
        let neg = b.get(self.at) == Some(&b'-');
        if neg {
            self.at += 1;
        }
        let start = self.at;
        let digits = b[start..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 || digits > 20 || (digits > 1 && b[start] == b'0') {
            return None;
        }
        self.at += digits;
        if matches!(b.get(self.at), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        Some((neg, &self.src[start..self.at]))
    }

    /// Any value, validated and skipped: its text (the span serde_json's
    /// `RawValue` would borrow).
    pub fn raw(&mut self) -> Option<&'a str> {
        self.peek()?;
        let start = self.at;
        self.skip()?;
        Some(&self.src[start..self.at])
    }

    /// Any value, validated and skipped.
    pub fn skip(&mut self) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(|s, _| s.skip()),
            b'[' => self.array(Self::skip),
            b'"' => self.string().map(drop),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.null().then_some(()),
            _ => self.number(),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.bytes()[self.at..].starts_with(word).then(|| {
            self.at += word.len();
        })
    }

    /// A number with at most 20 digits before and after its point and no
    /// exponent (an exponent could overflow where serde_json refuses).
    fn number(&mut self) -> Option<()> {
        let b = self.bytes();
        if b.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        let int = b[self.at..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if int == 0 || int > 20 || (int > 1 && b[self.at] == b'0') {
            return None;
        }
        self.at += int;
        if b.get(self.at) == Some(&b'.') {
            self.at += 1;
            let frac = b[self.at..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count();
            if frac == 0 || frac > 20 {
                return None;
            }
            self.at += frac;
        }
        (!matches!(b.get(self.at), Some(b'e' | b'E'))).then_some(())
    }
}

/// The first byte at or after `i` that ends a string's plain run: a
/// quote, a backslash or a control character (which JSON forbids raw).
/// Eight bytes at a time: a byte of `v ^ q` is zero where `v` has `q`,
/// and `(x - 0x01..) & !x & 0x80..` flags the lowest zero byte of `x`
/// exactly (a borrow can flag bytes above it, never below); `(v -
/// 0x20..) & !v & 0x80..` likewise flags the lowest byte below 0x20. The
/// lowest flag of the three is the first special byte.
#[inline]
fn special(b: &[u8], mut i: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    while let Some(w) = b.get(i..i + 8) {
        let Ok(w) = <[u8; 8]>::try_from(w) else { break };
        let v = u64::from_le_bytes(w);
        let quote = v ^ (ONES * u64::from(b'"'));
        let slash = v ^ (ONES * u64::from(b'\\'));
        let flags = (quote.wrapping_sub(ONES) & !quote)
            | (slash.wrapping_sub(ONES) & !slash)
            | (v.wrapping_sub(ONES * 0x20) & !v);
        let flags = flags & HIGH;
        if flags != 0 {
            return Some(i + (flags.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    b.get(i..)?
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .map(|n| i + n)
}

/// The fields of one object read so far: serde's derive refuses a
/// duplicated field, and so does the reader.
#[derive(Default)]
pub struct Fields(u8);

impl Fields {
    /// Reads field number `bit` with `read` unless it is `null` (absent,
    /// as serde's `Option` reads it); `None` if it came before or does
    /// not read.
    #[inline]
    pub fn once<'a, T>(
        &mut self,
        bit: u8,
        s: &mut Scan<'a>,
        read: impl FnOnce(&mut Scan<'a>) -> Option<T>,
    ) -> Option<Option<T>> {
        if self.0 & (1 << bit) != 0 {
            return None;
        }
        self.0 |= 1 << bit;
        if s.null() {
            return Some(None);
        }
        read(s).map(Some)
    }
}

/// The value of a run of ASCII digits; `None` past `u64::MAX`. Up to 19
/// digits cannot overflow (10^19 − 1 < 2^64), so they are summed without
/// checks; longer runs take the checked parse.
fn value(digits: &str) -> Option<u64> {
    if digits.len() > 19 {
        return digits.parse().ok();
    }
    Some(
        digits
            .bytes()
            .fold(0u64, |n, c| n * 10 + u64::from(c - b'0')),
    )
}

fn hex4(h: &[u8]) -> Option<u32> {
    h.iter()
        .try_fold(0u32, |acc, &c| Some(acc * 16 + char::from(c).to_digit(16)?))
}

#[cfg(test)]
pub mod generate;
#[cfg(test)]
mod tests;
