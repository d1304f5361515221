//! A minimal RESP2 connection over a plain `TcpStream`.
//!
//! The `redis` crate drives ordinary commands. This exists for the two jobs it does not fit:
//! pub/sub the way Redisson does it (SUBSCRIBE/UNSUBSCRIBE one channel, wait for one message with
//! a timeout; the crate's `PubSub` sends an extra PUNSUBSCRIBE when dropped), and tens of
//! thousands of idle or blocked connections driven from one thread.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// A pub/sub "message" push: `["message", channel, payload]`.
    pub fn is_message(&self) -> bool {
        match self {
            Resp::Array(Some(items)) => {
                matches!(items.first(), Some(Resp::Bulk(Some(kind))) if kind == b"message")
            }
            _ => false,
        }
    }

    /// The payload of a pub/sub "message" push.
    pub fn message_payload(&self) -> Option<&[u8]> {
        match self {
            Resp::Array(Some(items)) if self.is_message() => match items.get(2) {
                Some(Resp::Bulk(Some(payload))) => Some(payload),
                _ => None,
            },
            _ => None,
        }
    }

    /// The first element of an array reply, e.g. "subscribe" for a subscription confirmation.
    pub fn kind(&self) -> Option<&[u8]> {
        match self {
            Resp::Array(Some(items)) => match items.first() {
                Some(Resp::Bulk(Some(kind))) => Some(kind),
                _ => None,
            },
            _ => None,
        }
    }
}

pub struct RawConn {
    stream: TcpStream,
    buffer: Vec<u8>,
    start: usize,
}

impl RawConn {
    pub fn connect(addr: SocketAddr) -> io::Result<RawConn> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(RawConn {
            stream,
            // Small: the waiter scenarios hold 100,000 of these.
            buffer: Vec::with_capacity(64),
            start: 0,
        })
    }

    pub fn send(&mut self, args: &[&[u8]]) -> io::Result<()> {
        self.stream.write_all(&encode(args))
    }

    /// Sends bytes already in RESP, e.g. a whole pipeline.
    pub fn send_encoded(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Blocks until one whole reply has arrived.
    pub fn read(&mut self) -> io::Result<Resp> {
        loop {
            if let Some(reply) = self.parse_buffered()? {
                return Ok(reply);
            }
            self.fill()?;
        }
    }

    /// One whole reply, or `None` if none arrived within `timeout`. Waits with poll(2), which
    /// is precise to well under a millisecond; a socket read timeout (SO_RCVTIMEO) is rounded
    /// up to kernel ticks, several ms, which would make the waiting client look late.
    pub fn read_within(&mut self, timeout: Duration) -> io::Result<Option<Resp>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(reply) = self.parse_buffered()? {
                return Ok(Some(reply));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            if self.wait_readable(left)? {
                self.fill()?;
            }
        }
    }

    /// Whether the socket became readable within `timeout`.
    fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        let mut poll = libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Round up: never wake before the deadline.
        let millis = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: `poll` points at one valid pollfd for the duration of the call, and the count
        // passed is 1.
        let ready = unsafe { libc::poll(&mut poll, 1, millis) };
        match ready {
            -1 => {
                let error = io::Error::last_os_error();
                if error.kind() == io::ErrorKind::Interrupted {
                    Ok(false)
                } else {
                    Err(error)
                }
            }
            0 => Ok(false),
            _ => Ok(true),
        }
    }

    pub fn call(&mut self, args: &[&[u8]]) -> io::Result<Resp> {
        self.send(args)?;
        self.read()
    }

    fn fill(&mut self) -> io::Result<()> {
        if self.start > 0 && self.start == self.buffer.len() {
            self.buffer.clear();
            self.start = 0;
        }
        let mut chunk = [0u8; 4096];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "server closed the connection",
            ));
        }
        self.buffer.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    fn parse_buffered(&mut self) -> io::Result<Option<Resp>> {
        match parse(&self.buffer[self.start..])? {
            Some((reply, used)) => {
                self.start += used;
                if self.start == self.buffer.len() {
                    self.buffer.clear();
                    self.start = 0;
                }
                Ok(Some(reply))
            }
            None => Ok(None),
        }
    }
}

pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    encode_into(&mut out, args.iter().copied());
    out
}

/// Appends one command in RESP to `out`: how pipelines are built without a copy per command.
pub fn encode_into<'a>(out: &mut Vec<u8>, args: impl ExactSizeIterator<Item = &'a [u8]>) {
    use std::io::Write as _;
    let _ = write!(out, "*{}\r\n", args.len());
    for arg in args {
        let _ = write!(out, "${}\r\n", arg.len());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("bad RESP: {what}"))
}

/// Parses one reply from the front of `input`: `Ok(None)` when it is not complete yet.
fn parse(input: &[u8]) -> io::Result<Option<(Resp, usize)>> {
    let Some(line_end) = input.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let Some((&kind, line)) = input[..line_end].split_first() else {
        return Err(bad("empty line"));
    };
    let line = std::str::from_utf8(line).map_err(|_| bad("non-UTF-8 header"))?;
    let after = line_end + 2;
    let number = || line.parse::<i64>().map_err(|_| bad("length"));
    match kind {
        b'+' => Ok(Some((Resp::Simple(line.to_string()), after))),
        b'-' => Ok(Some((Resp::Error(line.to_string()), after))),
        b':' => Ok(Some((Resp::Int(number()?), after))),
        b'$' => {
            let len = number()?;
            if len < 0 {
                return Ok(Some((Resp::Bulk(None), after)));
            }
            let len = len as usize;
            if input.len() < after + len + 2 {
                return Ok(None);
            }
            let data = input[after..after + len].to_vec();
            Ok(Some((Resp::Bulk(Some(data)), after + len + 2)))
        }
        b'*' => {
            let count = number()?;
            if count < 0 {
                return Ok(Some((Resp::Array(None), after)));
            }
            let mut items = Vec::with_capacity(count as usize);
            let mut used = after;
            for _ in 0..count {
                match parse(&input[used..])? {
                    Some((item, n)) => {
                        items.push(item);
                        used += n;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Resp::Array(Some(items)), used)))
        }
        _ => Err(bad("unknown type byte")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Input, and the reply with the bytes it used (`None`: incomplete, wait for more).
    type Case = (&'static [u8], Option<(Resp, usize)>);

    #[test]
    fn parses_each_reply_type_and_waits_for_incomplete_ones() {
        let cases: &[Case] = &[
            (b"+OK\r\n", Some((Resp::Simple("OK".into()), 5))),
            (b"-ERR x\r\n", Some((Resp::Error("ERR x".into()), 8))),
            (b":42\r\n", Some((Resp::Int(42), 5))),
            (b"$-1\r\n", Some((Resp::Bulk(None), 5))),
            (
                b"$3\r\nabc\r\n",
                Some((Resp::Bulk(Some(b"abc".to_vec())), 9)),
            ),
            (b"$3\r\nab", None),
            (b"*2\r\n:1\r\n", None),
            (
                b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\n0\r\n",
                Some((
                    Resp::Array(Some(vec![
                        Resp::Bulk(Some(b"message".to_vec())),
                        Resp::Bulk(Some(b"ch".to_vec())),
                        Resp::Bulk(Some(b"0".to_vec())),
                    ])),
                    32,
                )),
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(&parse(input).unwrap(), expected, "{input:?}");
        }
    }

    #[test]
    fn recognises_a_message_push() {
        let (push, _) = parse(b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\n0\r\n")
            .unwrap()
            .unwrap();
        assert!(push.is_message());
        assert_eq!(push.message_payload(), Some(&b"0"[..]));
        assert_eq!(push.kind(), Some(&b"message"[..]));
    }
}
