//! Plain-socket clients, for tests that need thousands of connections at once.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use redis::Value;

/// A client on a plain socket, for tests that need thousands of connections at once (a
/// `Connection` blocked in `WAIT` needs a thread of its own): commands are written as they come,
/// without waiting, and the replies read later, in order.
pub struct RawClient {
    reader: BufReader<TcpStream>,
}

impl RawClient {
    pub fn connect(port: u16) -> std::io::Result<RawClient> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        // Small: a test may hold ten thousand of these.
        Ok(RawClient {
            reader: BufReader::with_capacity(512, stream),
        })
    }

    /// Writes the commands in one write (a pipeline); their replies are not read.
    pub fn send(&mut self, cmds: &[&redis::Cmd]) -> std::io::Result<()> {
        let bytes: Vec<u8> = cmds.iter().flat_map(|c| c.get_packed_command()).collect();
        self.reader.get_mut().write_all(&bytes)
    }

    /// The next reply, as a `Connection` would give it (a server error is `Err`, with its
    /// code). An I/O error when none arrived within `timeout` or the connection closed.
    pub fn reply(&mut self, timeout: Duration) -> redis::RedisResult<Value> {
        self.reader.get_ref().set_read_timeout(Some(timeout))?;
        let mut frame = Vec::new();
        read_frame(&mut self.reader, &mut frame)?;
        redis::parse_redis_value(&frame)
    }

    /// Sends one command and reads its reply.
    pub fn query(&mut self, cmd: &redis::Cmd, timeout: Duration) -> redis::RedisResult<Value> {
        self.send(&[cmd])?;
        self.reply(timeout)
    }
}

/// Appends one RESP2 reply, as its bytes, to `out`.
fn read_frame(reader: &mut impl BufRead, out: &mut Vec<u8>) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    let start = out.len();
    if reader.read_until(b'\n', out)? == 0 {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    let line = &out[start..];
    let kind = line[0];
    let length = || -> std::io::Result<i64> {
        std::str::from_utf8(&line[1..])
            .ok()
            .and_then(|n| n.trim_end().parse().ok())
            .ok_or_else(|| Error::new(ErrorKind::InvalidData, "bad RESP length"))
    };
    match kind {
        b'$' => {
            let n = length()?;
            if n >= 0 {
                let mut body = vec![0; n as usize + 2];
                reader.read_exact(&mut body)?;
                out.extend_from_slice(&body);
            }
        }
        b'*' => {
            for _ in 0..length()?.max(0) {
                read_frame(reader, out)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The soft limit on this process's open files (`ulimit -n`), from `/proc/self/limits`.
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    match line.split_whitespace().nth(3)? {
        "unlimited" => Some(u64::MAX),
        soft => soft.parse().ok(),
    }
}
