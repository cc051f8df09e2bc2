//! Streaming JSON framing: RFC 7047 sends JSON texts back to back with no delimiter, so a
//! read may end in the middle of a message or hold several. [`Framer`] buffers bytes and
//! yields each complete JSON value once it has arrived.

use serde_json::Value;

use crate::{Error, Result};

/// Largest message accepted before the peer is considered broken (OVN's NB with thousands
/// of rows stays far below this).
pub const MAX_MESSAGE: usize = 256 * 1024 * 1024;

/// Accumulates bytes from the socket and splits them into JSON values.
#[derive(Debug, Default)]
pub struct Framer {
    buf: Vec<u8>,
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

    /// The next complete value, `Ok(None)` if more bytes are needed.
    pub fn next_value(&mut self) -> Result<Option<Value>> {
        let start = self
            .buf
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .unwrap_or(self.buf.len());
        if start == self.buf.len() {
            self.buf.clear();
            return Ok(None);
        }
        let mut stream =
            serde_json::Deserializer::from_slice(&self.buf[start..]).into_iter::<Value>();
        match stream.next() {
            Some(Ok(v)) => {
                let used = start + stream.byte_offset();
                self.buf.drain(..used);
                Ok(Some(v))
            }
            Some(Err(e)) if e.is_eof() => {
                if self.buf.len() > MAX_MESSAGE {
                    return Err(Error::Protocol(format!(
                        "message larger than {MAX_MESSAGE} bytes without completing"
                    )));
                }
                Ok(None)
            }
            Some(Err(e)) => Err(Error::Protocol(format!("invalid JSON from server: {e}"))),
            None => Ok(None),
        }
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
        let mut f = Framer::new();
        f.push(b"{\"id\":1,]");
        assert!(matches!(f.next_value(), Err(Error::Protocol(_))));
    }
}
