//! InvokeModelWithResponseStream answers in AWS event-stream frames
//! (binary, length-prefixed, CRC-checked), decoded here by
//! `aws-smithy-eventstream`. Each `chunk` event carries one Anthropic
//! stream event as base64 JSON in its `bytes` field; it goes on as the SSE
//! event its `type` names, so the relay meters it as it meters
//! Anthropic's own stream. An exception frame (throttling, a model stream
//! error) becomes an Anthropic `error` event and ends the stream.

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::{HeaderValue, Message};
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt as _};
use serde_json::{json, Value};

/// What one frame becomes on the SSE side.
#[derive(Debug, PartialEq, Eq)]
pub enum Translated {
    /// An SSE event (with its blank line), the stream goes on.
    Event(Bytes),
    /// The stream's last SSE event (an `error`).
    Last(Bytes),
    /// Nothing to relay (an event of another type).
    Skip,
}

fn header<'m>(m: &'m Message, name: &str) -> Option<&'m str> {
    m.headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| match h.value() {
            HeaderValue::String(s) => Some(s.as_str()),
            _ => None,
        })
}

/// `event: <name>` and `data: <json>` lines (one per line of `data`).
fn sse(name: &str, data: &str) -> Bytes {
    let mut out = String::with_capacity(data.len() + name.len() + 16);
    out.push_str("event: ");
    out.push_str(name);
    out.push('\n');
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line.trim_end_matches('\r'));
        out.push('\n');
    }
    out.push('\n');
    Bytes::from(out)
}

/// The Anthropic `error` event of a Bedrock exception named `exception`.
pub fn error_event(exception: &str, message: &str) -> Bytes {
    let data = json!({"type": "error", "error": {"type": crate::upstreams::failure::bedrock::anthropic_error_type(exception), "message": message}});
    sse("error", &data.to_string())
}

/// One decoded frame as SSE.
pub fn translate(m: &Message) -> Translated {
    match header(m, ":message-type") {
        Some("event") => {
            if header(m, ":event-type") != Some("chunk") {
                return Translated::Skip;
            }
            let chunk = serde_json::from_slice::<Value>(m.payload())
                .ok()
                .and_then(|v| v.get("bytes").and_then(Value::as_str).map(str::to_string))
                .and_then(|b| aws_smithy_types::base64::decode(b).ok());
            let Some(chunk) = chunk else {
                return Translated::Last(error_event(
                    "modelStreamErrorException",
                    "Bedrock sent a chunk without decodable bytes.",
                ));
            };
            let text = String::from_utf8_lossy(&chunk);
            let name = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_string));
            match name {
                Some(n) => Translated::Event(sse(&n, &text)),
                None => Translated::Skip,
            }
        }
        Some("exception") => {
            let name = header(m, ":exception-type").unwrap_or("internalServerException");
            let message = serde_json::from_slice::<Value>(m.payload())
                .ok()
                .and_then(|v| {
                    v.get("message")
                        .or_else(|| v.get("Message"))
                        .and_then(Value::as_str)
                        .map(str::to_string)
                })
                .unwrap_or_else(|| format!("Bedrock ended the stream with {name}."));
            Translated::Last(error_event(name, &message))
        }
        Some("error") => {
            let name = header(m, ":error-code").unwrap_or("internalServerException");
            let message = header(m, ":error-message").unwrap_or("Bedrock ended the stream.");
            Translated::Last(error_event(name, message))
        }
        _ => Translated::Skip,
    }
}

/// The event-stream body `frames` as an SSE byte stream. A frame that
/// does not decode ends the stream with an `error` event; a stream that
/// ends inside a frame ends there (the relay settles what it saw). A read
/// error goes on as it came: a timeout stays a timeout, which the relay
/// cuts off cleanly (`time_limit`) as it does an SSE upstream's.
pub fn to_sse<S, E>(frames: S) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin + 'static,
    E: Into<std::io::Error> + Send,
{
    struct State<S> {
        frames: S,
        buf: BytesMut,
        decoder: MessageFrameDecoder,
        done: bool,
    }
    let state = State {
        frames,
        buf: BytesMut::new(),
        decoder: MessageFrameDecoder::new(),
        done: false,
    };
    futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if st.done {
                return None;
            }
            match st.decoder.decode_frame(&mut st.buf) {
                Ok(DecodedFrame::Complete(m)) => match translate(&m) {
                    Translated::Event(b) => return Some((Ok(b), st)),
                    Translated::Last(b) => {
                        st.done = true;
                        return Some((Ok(b), st));
                    }
                    Translated::Skip => continue,
                },
                Ok(DecodedFrame::Incomplete) => {}
                Err(_) => {
                    st.done = true;
                    let b = error_event(
                        "modelStreamErrorException",
                        "Bedrock's event stream could not be decoded.",
                    );
                    return Some((Ok(b), st));
                }
            }
            match st.frames.next().await {
                Some(Ok(b)) => st.buf.extend_from_slice(&b),
                Some(Err(e)) => {
                    st.done = true;
                    return Some((Err(e.into()), st));
                }
                None => return None,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_eventstream::frame::write_message_to;
    use aws_smithy_types::event_stream::Header;

    fn frame(m: &Message) -> Vec<u8> {
        let mut out = Vec::new();
        write_message_to(m, &mut out).unwrap();
        out
    }

    fn chunk(json: &str) -> Message {
        let payload = json!({"bytes": aws_smithy_types::base64::encode(json)}).to_string();
        Message::new(payload)
            .add_header(Header::new(
                ":message-type",
                HeaderValue::String("event".into()),
            ))
            .add_header(Header::new(
                ":event-type",
                HeaderValue::String("chunk".into()),
            ))
    }

    #[tokio::test]
    async fn chunks_split_anywhere_become_named_sse_events_and_an_exception_ends_in_error() {
        let mut bytes = frame(&chunk(r#"{"type":"message_start","message":{}}"#));
        bytes.extend(frame(&chunk(
            r#"{"type":"content_block_delta","delta":{"text":"hi"}}"#,
        )));
        let exc = Message::new(r#"{"message":"Too many tokens, please wait."}"#)
            .add_header(Header::new(
                ":message-type",
                HeaderValue::String("exception".into()),
            ))
            .add_header(Header::new(
                ":exception-type",
                HeaderValue::String("throttlingException".into()),
            ));
        bytes.extend(frame(&exc));
        // One byte per read: frames reassembled across reads.
        let pieces: Vec<Result<Bytes, std::io::Error>> = bytes
            .iter()
            .map(|b| Ok(Bytes::copy_from_slice(&[*b])))
            .collect();
        let out: Vec<Bytes> = to_sse(futures_util::stream::iter(pieces))
            .map(|r| r.unwrap())
            .collect()
            .await;
        assert_eq!(out.len(), 3);
        assert_eq!(
            out[0],
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n"
        );
        assert!(out[1].starts_with(b"event: content_block_delta\n"));
        let last = String::from_utf8_lossy(&out[2]);
        assert!(last.starts_with("event: error\n"), "{last}");
        assert!(last.contains("rate_limit_error") && last.contains("Too many tokens"));
    }

    #[tokio::test]
    async fn a_corrupt_frame_ends_in_an_error_event() {
        let mut bytes = frame(&chunk(r#"{"type":"ping"}"#));
        let n = bytes.len();
        bytes[n - 1] ^= 0xff; // the message CRC
        let out: Vec<Bytes> = to_sse(futures_util::stream::iter(vec![Ok::<_, std::io::Error>(
            Bytes::from(bytes),
        )]))
        .map(|r| r.unwrap())
        .collect()
        .await;
        assert_eq!(out.len(), 1);
        assert!(out[0].starts_with(b"event: error\n"));
    }
}
