//! Streaming JSON framing: RFC 7047 sends JSON texts back to back with no delimiter, so a
//! read may end in the middle of a message or hold several. [`Framer`] buffers bytes and
//! yields each complete JSON value once it has arrived.
//!
//! Linear in the bytes received: a small scanner (the open brackets, inside a string, after
//! a backslash) walks each byte once, across reads, and serde_json parses a message only once
//! it is complete; a bracket that closes the wrong one, or a byte no JSON token has outside a
//! string, is refused as it arrives (not when the message would have ended); consumed messages are dropped from the buffer in amortised O(1) per byte.
//! (Re-parsing the buffer on every read cost O(n²/read size) for a large monitor reply.)
//! Every JSON-RPC message is an object, so a top-level value must be an object or an array.

use serde_json::Value;

use crate::{Error, Result};

/// Largest message accepted before the peer is considered broken (OVN's NB with thousands
/// of rows stays far below this).
pub const MAX_MESSAGE: usize = 256 * 1024 * 1024;

/// Deepest nesting accepted (serde_json's own recursion limit is 128).
pub const MAX_DEPTH: u32 = 128;

/// Consumed bytes are dropped from the buffer's front once there are this many and they
/// are at least half of it.
const COMPACT_AT: usize = 64 * 1024;

/// Accumulates bytes from the socket and splits them into JSON values.
#[derive(Debug, Default)]
pub struct Framer {
    buf: Vec<u8>,
    /// Where the value being scanned starts (bytes before it are consumed).
    start: usize,
    /// How far the scanner has read.
    scan: usize,
    /// The closing bracket each open object and array needs, innermost last; empty before
    /// a value begins.
    open: Vec<u8>,
    /// Inside a string.
    in_str: bool,
    /// Right after a backslash inside a string.
    escaped: bool,
}

impl Framer {
    /// An empty framer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append bytes read from the connection.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes held that are not yet part of a returned value.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next complete value, `Ok(None)` if more bytes are needed.
    pub fn next_value(&mut self) -> Result<Option<Value>> {
        while self.scan < self.buf.len() {
            let b = self.buf[self.scan];
            self.scan += 1;
            if self.open.is_empty() {
                match b {
                    b' ' | b'\t' | b'\n' | b'\r' => self.start = self.scan,
                    b'{' => self.open.push(b'}'),
                    b'[' => self.open.push(b']'),
                    _ => {
                        return Err(Error::Protocol(format!(
                            "invalid JSON from server: a message must be a JSON object, not \
                             one starting with {:?}",
                            char::from(b)
                        )));
                    }
                }
            } else if self.in_str {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_str = false,
                    _ => {}
                }
            } else {
                match b {
                    b'"' => self.in_str = true,
                    b'{' | b'[' => {
                        if self.open.len() >= MAX_DEPTH as usize {
                            return Err(Error::Protocol(format!(
                                "invalid JSON from server: nested deeper than {MAX_DEPTH}"
                            )));
                        }
                        self.open.push(if b == b'{' { b'}' } else { b']' });
                    }
                    b'}' | b']' => {
                        if self.open.pop() != Some(b) {
                            return Err(Error::Protocol(format!(
                                "invalid JSON from server: {:?} closes nothing open there",
                                char::from(b)
                            )));
                        }
                        if self.open.is_empty() {
                            return self.complete().map(Some);
                        }
                    }
                    // numbers, true, false, null, separators and white space
                    b' ' | b'\t' | b'\n' | b'\r' | b',' | b':' | b'-' | b'+' | b'.' => {}
                    b'0'..=b'9'
                    | b'e'
                    | b'E'
                    | b't'
                    | b'r'
                    | b'u'
                    | b'f'
                    | b'a'
                    | b'l'
                    | b's'
                    | b'n' => {}
                    _ => {
                        return Err(Error::Protocol(format!(
                            "invalid JSON from server: byte {:?} outside a string",
                            char::from(b)
                        )));
                    }
                }
            }
        }
        if self.start == self.buf.len() {
            // only whitespace, or nothing, left
            self.buf.clear();
            self.start = 0;
            self.scan = 0;
        } else if self.pending() > MAX_MESSAGE {
            return Err(Error::Protocol(format!(
                "message larger than {MAX_MESSAGE} bytes without completing"
            )));
        }
        Ok(None)
    }

    /// Parse the value that ends at `scan` and consume it.
    fn complete(&mut self) -> Result<Value> {
        let v = serde_json::from_slice(&self.buf[self.start..self.scan])
            .map_err(|e| Error::Protocol(format!("invalid JSON from server: {e}")));
        self.start = self.scan;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            self.scan = 0;
        } else if self.start >= COMPACT_AT && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.scan -= self.start;
            self.start = 0;
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn drain(f: &mut Framer) -> Vec<Value> {
        let mut out = vec![];
        while let Some(v) = f.next_value().unwrap() {
            out.push(v);
        }
        out
    }

    #[test]
    fn splits_back_to_back_messages() {
        let mut f = Framer::new();
        f.push(br#"{"id":1,"result":[]}{"id":2,"result":{}} {"id":null,"method":"update","params":[]}"#);
        let v = drain(&mut f);
        assert_eq!(v.len(), 3);
        assert_eq!(v[1], json!({"id":2,"result":{}}));
        assert_eq!(v[2]["method"], "update");
    }

    #[test]
    fn waits_for_a_message_cut_anywhere() {
        let msg = br#"{"id":7,"result":[{"rows":[{"name":"ls\"1}"}]}]}"#;
        for cut in 0..msg.len() {
            let mut f = Framer::new();
            f.push(&msg[..cut]);
            assert_eq!(f.next_value().unwrap(), None, "cut at {cut}");
            f.push(&msg[cut..]);
            let v = f.next_value().unwrap().expect("complete after second part");
            assert_eq!(v["id"], 7);
            assert_eq!(f.next_value().unwrap(), None);
        }
    }

    #[test]
    fn whitespace_only_is_not_a_message() {
        let mut f = Framer::new();
        f.push(b" \n\t ");
        assert_eq!(f.next_value().unwrap(), None);
    }

    #[test]
    fn garbage_is_a_protocol_error() {
        for garbage in [
            &b"{\"id\":1,]"[..],
            b"{\"id\":1}}",
            b"42 ",
            b"\"a string\"",
            b"nul",
            b"{\"a\":tru}",
        ] {
            let mut f = Framer::new();
            f.push(garbage);
            let got = drain_until_error(&mut f);
            assert!(
                matches!(got, Err(Error::Protocol(_))),
                "{:?}: {got:?}",
                String::from_utf8_lossy(garbage)
            );
        }
    }

    /// A wrong bracket or a stray byte is refused as it arrives, before the message could end.
    #[test]
    fn broken_messages_are_refused_before_they_end() {
        for garbage in [&b"{\"id\": 1, \"result\": [}"[..], b"{\"id\": x", b"[1, 2}"] {
            let mut f = Framer::new();
            f.push(garbage);
            assert!(
                matches!(f.next_value(), Err(Error::Protocol(m)) if m.contains("invalid JSON")),
                "{:?}",
                String::from_utf8_lossy(garbage)
            );
        }
    }

    fn drain_until_error(f: &mut Framer) -> Result<()> {
        while f.next_value()?.is_some() {}
        Ok(())
    }

    #[test]
    fn brackets_and_quotes_inside_strings_do_not_end_a_message() {
        let mut f = Framer::new();
        let msg = br#"{"a":"}]{[\"\\","b":["x\\\"}"]}"#;
        f.push(msg);
        let v = drain(&mut f);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0]["a"], "}]{[\"\\");
        assert_eq!(v[0]["b"][0], "x\\\"}");
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_refused() {
        let mut f = Framer::new();
        f.push(&vec![b'['; MAX_DEPTH as usize + 1]);
        assert!(matches!(f.next_value(), Err(Error::Protocol(_))));
        let mut ok = Framer::new();
        let depth = MAX_DEPTH as usize - 1;
        ok.push(&[vec![b'['; depth], vec![b']'; depth]].concat());
        assert_eq!(drain(&mut ok).len(), 1);
    }

    /// Many messages and a large one, fed a few bytes at a time: the same values as in one
    /// piece, and the buffer holds no consumed bytes at the end.
    #[test]
    fn a_stream_fed_in_small_pieces_yields_the_same_values() {
        let mut stream = Vec::new();
        let mut want = Vec::new();
        for i in 0..500 {
            let v =
                json!({"id": i, "result": [{"rows": [{"name": format!("ls{i}\"}}]"), "n": i}]}]});
            stream.extend(serde_json::to_vec(&v).unwrap());
            stream.extend(b"\n");
            want.push(v);
        }
        let big = json!({"id": "big", "result": (0..20_000).map(|i| json!({"k": i})).collect::<Vec<_>>()});
        stream.extend(serde_json::to_vec(&big).unwrap());
        want.push(big);
        for piece in [1, 7, 4096, 70_000] {
            let mut f = Framer::new();
            let mut got = Vec::new();
            for chunk in stream.chunks(piece) {
                f.push(chunk);
                got.extend(drain(&mut f));
            }
            assert_eq!(got, want, "pieces of {piece}");
            assert_eq!(f.pending(), 0);
            assert_eq!(f.buf.len(), 0, "consumed bytes dropped");
        }
    }
}
