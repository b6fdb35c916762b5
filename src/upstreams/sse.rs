//! Server-sent events by frames (DESIGN section 5; WHATWG HTML Living
//! Standard, "Server-sent events", for line endings and fields).
//!
//! [`FrameSplitter`] cuts a raw byte stream into frames, each ending with a
//! blank line (`\n\n`, `\r\n\r\n`, `\r\r` or mixtures), keeping each frame's
//! original bytes so the relay can forward it untouched. A `\r` at the end
//! of a read is held back until the next read says whether `\n` follows,
//! and frames split inside UTF-8 characters are fine because splitting
//! works on bytes. [`parse_frame`] reads a frame's fields.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};

/// The largest frame the splitter buffers: far above any real event (the
/// largest are a Responses `response.completed` repeating the whole
/// output, a generated image included, a few MB). An upstream that sends
/// more without a blank line is cut off ([`FrameSplitter::frame_too_large`]).
pub const MAX_FRAME_BYTES: usize = 8 << 20;

/// Cuts a byte stream into SSE frames.
#[derive(Debug, Default)]
pub struct FrameSplitter {
    /// A read handed over whole ([`feed_bytes`](Self::feed_bytes)) while
    /// nothing was buffered: its frames are cut out of it without a copy.
    read: Bytes,
    buf: BytesMut,
    /// The current frame starts at 0 (in `read` when it is not empty, else
    /// in `buf`); `line` is where its current line starts, `scan` the
    /// first byte not examined yet (≥ `line`): a line that goes on over
    /// many reads is examined once, not again from its start on each.
    line: usize,
    scan: usize,
    /// Bytes examined so far (each once).
    #[cfg(test)]
    scanned: usize,
}

impl FrameSplitter {
    /// An empty splitter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds bytes read from the upstream and returns every frame completed,
    /// each with its terminating blank line.
    pub fn push(&mut self, data: &[u8]) -> Vec<Bytes> {
        self.feed(data);
        std::iter::from_fn(|| self.next_frame()).collect()
    }

    /// Adds bytes read from the upstream; [`next_frame`](Self::next_frame)
    /// then returns the frames they completed, one by one (no list per read).
    pub fn feed(&mut self, data: &[u8]) {
        self.keep_read();
        self.buf.extend_from_slice(data);
    }

    /// As [`feed`](Self::feed), for a read the splitter may keep: when
    /// nothing is buffered, the frames it holds whole are handed out as
    /// slices of it (one event per read is the common case: no copy).
    pub fn feed_bytes(&mut self, data: Bytes) {
        if self.read.is_empty() && self.buf.is_empty() {
            self.read = data;
        } else {
            self.feed(&data);
        }
    }

    /// Moves what is left of a kept read into the buffer (the scan
    /// position stays valid: the buffer was empty).
    fn keep_read(&mut self) {
        if !self.read.is_empty() {
            self.buf.extend_from_slice(&self.read);
            self.read = Bytes::new();
        }
    }

    /// The next complete frame, with its terminating blank line.
    pub fn next_frame(&mut self) -> Option<Bytes> {
        if !self.read.is_empty() {
            match self.scan_in(true) {
                Some(end) => return Some(self.read.split_to(end)),
                // A frame that goes on in the next read.
                None => self.keep_read(),
            }
            return None;
        }
        self.scan_in(false)
            .map(|end| self.buf.split_to(end).freeze())
    }

    /// Scans `read` (or `buf`) on from where the last scan stopped: the end
    /// of the first frame, the positions reset for the next one; or `None`,
    /// the positions kept for more bytes.
    fn scan_in(&mut self, in_read: bool) -> Option<usize> {
        let bytes: &[u8] = if in_read { &self.read } else { &self.buf };
        let from = self.scan;
        let found = scan_frame(bytes, self.line, from);
        let stop = match found {
            Ok(end) => {
                self.line = 0;
                self.scan = 0;
                end
            }
            Err((line, scan)) => {
                self.line = line;
                self.scan = scan;
                scan
            }
        };
        #[cfg(test)]
        {
            self.scanned += stop - from;
        }
        let _ = stop;
        found.ok()
    }

    /// True when the frame being read has grown past [`MAX_FRAME_BYTES`]
    /// without ending (asked when [`next_frame`](Self::next_frame) has none).
    pub fn frame_too_large(&self) -> bool {
        self.read.len() + self.buf.len() > MAX_FRAME_BYTES
    }

    /// At end of stream: the last frame, if bytes are left, terminated with
    /// a blank line. A `\r` held back by [`push`](Self::push) is a line end
    /// now that no `\n` can follow, so a frame that was already complete
    /// (`data: x\r\r`) comes back byte for byte; an unterminated one gets
    /// the fewest line ends that complete it.
    pub fn finish(&mut self) -> Option<Bytes> {
        self.keep_read();
        self.line = 0;
        self.scan = 0;
        let rest = self.buf.split();
        if rest.is_empty() {
            return None;
        }
        let mut framed = rest.to_vec();
        match ends_with_line_end(&framed) {
            None => framed.extend_from_slice(b"\n\n"),
            Some(len) => {
                let last_line_start = framed[..framed.len() - len]
                    .iter()
                    .rposition(|b| *b == b'\n' || *b == b'\r')
                    .map_or(0, |p| p + 1);
                if last_line_start < framed.len() - len {
                    // The last line has content: repeat its line end to end the frame.
                    let end = framed[framed.len() - len..].to_vec();
                    framed.extend_from_slice(&end);
                }
            }
        }
        Some(Bytes::from(framed))
    }
}

/// Scans `buf` line by line from `from` (in the line that starts at
/// `line_start`) for the blank line that ends the first frame: `Ok(frame
/// end)`, or `Err((line start, where to resume))` when more bytes are
/// needed. A `\r` as the last byte is not decided until the next byte says
/// whether it starts a `\r\n`: the scan resumes at it.
fn scan_frame(buf: &[u8], mut line_start: usize, mut from: usize) -> Result<usize, (usize, usize)> {
    loop {
        let Some(off) = memchr::memchr2(b'\n', b'\r', &buf[from..]) else {
            return Err((line_start, buf.len()));
        };
        let i = from + off;
        let end = if buf[i] == b'\r' {
            match buf.get(i + 1) {
                None => return Err((line_start, i)),
                Some(b'\n') => i + 2,
                Some(_) => i + 1,
            }
        } else {
            i + 1
        };
        if i == line_start {
            return Ok(end);
        }
        line_start = end;
        from = end;
    }
}

/// Length of the line end (`\r\n`, `\n` or `\r`) at the end of `b`, if any.
fn ends_with_line_end(b: &[u8]) -> Option<usize> {
    if b.ends_with(b"\r\n") {
        Some(2)
    } else if b.ends_with(b"\n") || b.ends_with(b"\r") {
        Some(1)
    } else {
        None
    }
}

/// What a frame carries, borrowed from the frame when it can be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<'a> {
    /// `event:` value, if any.
    pub event: Option<Cow<'a, str>>,
    /// `data:` lines joined with `\n`; `None` when the frame has no data
    /// line. Borrowed when the frame has one data line and is valid UTF-8.
    pub data: Option<Cow<'a, str>>,
    /// True when the frame has only comments (`: keep-alive`) or is empty.
    pub comment_only: bool,
}

/// Parses one frame's fields (`data`, `event`; `id` and `retry` are read
/// and ignored, comments noted). Invalid UTF-8 is replaced, never panics.
pub fn parse_frame(raw: &[u8]) -> Frame<'_> {
    // Valid UTF-8 (every provider's stream) is read in place; the lines
    // are found by byte, `\n` and `\r` being ASCII.
    match std::str::from_utf8(raw) {
        Ok(text) => parse_text(text),
        Err(_) => {
            let text = String::from_utf8_lossy(raw).into_owned();
            let f = parse_text(&text);
            Frame {
                event: f.event.map(|e| Cow::Owned(e.into_owned())),
                data: f.data.map(|d| Cow::Owned(d.into_owned())),
                comment_only: f.comment_only,
            }
        }
    }
}

fn parse_text(text: &str) -> Frame<'_> {
    let mut data: Option<Cow<'_, str>> = None;
    let mut event = None;
    let mut only_comments = true;
    let bytes = text.as_bytes();
    let mut start = 0;
    while start <= bytes.len() {
        let end = memchr::memchr2(b'\n', b'\r', &bytes[start..]).map_or(bytes.len(), |i| start + i);
        let line = &text[start..end];
        start = end + 1;
        if line.is_empty() || line.starts_with(':') {
            continue;
        }
        only_comments = false;
        let (field, value) = match line.find(':') {
            Some(p) => {
                let v = &line[p + 1..];
                (&line[..p], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (line, ""),
        };
        match field {
            "data" => match &mut data {
                Some(d) => {
                    let d = d.to_mut();
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(Cow::Borrowed(value)),
            },
            "event" => event = Some(Cow::Borrowed(value)),
            _ => {}
        }
    }
    Frame {
        event,
        data,
        comment_only: only_comments,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Every frame of `reads`, then the last one, by `feed_bytes` or `feed`.
    fn frames(reads: &[Vec<u8>], whole: bool) -> Vec<Bytes> {
        let mut s = FrameSplitter::new();
        let mut out = Vec::new();
        for r in reads {
            if whole {
                s.feed_bytes(Bytes::copy_from_slice(r));
            } else {
                s.feed(r);
            }
            out.extend(std::iter::from_fn(|| s.next_frame()));
        }
        out.extend(s.finish());
        out
    }

    proptest! {
        /// Reads kept whole are cut as copied ones are: any bytes of SSE
        /// lines and line ends, cut anywhere.
        #[test]
        fn reads_kept_whole_split_as_copied_ones(
            pieces in prop::collection::vec(prop::sample::select(vec![
                "data: {\"a\":1}", "\n", "\r", "\r\n", ": ping", "event: x", "data: é", "id: 1",
            ]), 0..40),
            cuts in prop::collection::vec(1usize..24, 1..8),
        ) {
            let bytes = pieces.concat().into_bytes();
            let mut reads = Vec::new();
            let mut rest = &bytes[..];
            for &n in cuts.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (a, b) = rest.split_at(n.min(rest.len()));
                reads.push(a.to_vec());
                rest = b;
            }
            prop_assert_eq!(frames(&reads, true), frames(&reads, false));
        }
    }

    #[test]
    fn a_line_read_in_many_pieces_is_scanned_once() {
        let mut s = FrameSplitter::new();
        let mut fed = 0;
        // 10 MB of one line without a line end, 16 KiB a read.
        let piece = vec![b'x'; 16 * 1024];
        s.feed_bytes(Bytes::from_static(b"data: "));
        fed += 6;
        assert!(s.next_frame().is_none());
        let mut too_large_at = None;
        while fed < 10_000_000 {
            s.feed_bytes(Bytes::copy_from_slice(&piece));
            fed += piece.len();
            assert!(s.next_frame().is_none());
            if too_large_at.is_none() && s.frame_too_large() {
                too_large_at = Some(fed);
            }
        }
        assert_eq!(s.scanned, fed, "each byte examined once");
        let at = too_large_at.expect("the frame passed the cap");
        assert!(at > MAX_FRAME_BYTES && at <= MAX_FRAME_BYTES + piece.len());
        // Its end still cuts it, scanned from where the scan stopped.
        s.feed_bytes(Bytes::from_static(b"\r"));
        assert!(s.next_frame().is_none());
        s.feed_bytes(Bytes::from_static(b"\n\r\n"));
        assert_eq!(s.next_frame().map(|f| f.len()), Some(fed + 4));
        assert_eq!(s.scanned, fed + 4);
        assert!(!s.frame_too_large());
    }

    #[test]
    fn splits_on_every_blank_line_style() {
        let mut s = FrameSplitter::new();
        let f = s.push(b"data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d\n");
        assert_eq!(
            f,
            vec![
                Bytes::from_static(b"data: a\n\n"),
                Bytes::from_static(b"data: b\r\n\r\n"),
                Bytes::from_static(b"data: c\r\r"),
            ]
        );
        assert_eq!(s.push(b"\n"), vec![Bytes::from_static(b"data: d\n\n")]);
    }

    #[test]
    fn cr_at_end_of_read_waits_for_next_byte() {
        let mut s = FrameSplitter::new();
        assert!(s.push(b"data: x\r\n\r").is_empty());
        assert_eq!(s.push(b"\n"), vec![Bytes::from_static(b"data: x\r\n\r\n")]);
    }

    #[test]
    fn finish_completes_the_last_frame_with_the_fewest_bytes() {
        let fin = |input: &[u8]| {
            let mut s = FrameSplitter::new();
            let mut out = s.push(input);
            out.extend(s.finish());
            out
        };
        // A complete frame whose final `\r` was held back comes out unchanged.
        assert_eq!(
            fin(b"data: c\r\r"),
            vec![Bytes::from_static(b"data: c\r\r")]
        );
        assert_eq!(
            fin(b"data: c\r\n\r"),
            vec![Bytes::from_static(b"data: c\r\n\r")]
        );
        assert_eq!(
            fin(b"data: c\r\n"),
            vec![Bytes::from_static(b"data: c\r\n\r\n")]
        );
        assert_eq!(fin(b"data: c\n"), vec![Bytes::from_static(b"data: c\n\n")]);
        assert_eq!(fin(b"data: c\r"), vec![Bytes::from_static(b"data: c\r\r")]);
        assert_eq!(fin(b"data: c"), vec![Bytes::from_static(b"data: c\n\n")]);
        assert_eq!(
            fin(b"data: a\n\n"),
            vec![Bytes::from_static(b"data: a\n\n")]
        );
        assert!(FrameSplitter::new().finish().is_none());
    }

    #[test]
    fn multi_line_data_and_comments() {
        let f = parse_frame(b": keep-alive\ndata: {\"a\":\ndata: 1}\nid: 7\n\n");
        assert_eq!(f.data.as_deref(), Some("{\"a\":\n1}"));
        assert!(!f.comment_only);
        assert!(parse_frame(b": ping\n\n").comment_only);
        let only_id = parse_frame(b"id: 3\nretry: 100\n\n");
        assert_eq!(only_id.data, None);
    }
}
