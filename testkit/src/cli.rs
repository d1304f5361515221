//! A `redis-cli` (`$LOCK_CLI`) process holding one connection, fed one command per line: what a
//! crashing application looks like when it is SIGKILLed (the kernel closes its socket, no
//! goodbye to the server) or frozen by SIGSTOP.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use crate::server::{cli_bin, send_signal, Signal};

/// How long `command` waits for a reply.
const REPLY_WITHIN: Duration = Duration::from_secs(10);

pub struct Cli {
    child: Child,
    stdin: ChildStdin,
    /// Its output, line by line, read by a thread of its own (a reply can be waited for with a
    /// timeout).
    lines: mpsc::Receiver<String>,
}

impl Cli {
    /// `redis-cli -p <port>`, its errors on stdout too (a CLIENT KILL prints "Error: Server
    /// closed the connection").
    pub fn start(port: u16) -> std::io::Result<Cli> {
        // `exec`: the shell becomes the CLI (same pid, so a signal reaches it). The CLI is passed
        // to sh as $0, the port as $1.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"exec "$0" -p "$1" 2>&1"#)
            .arg(cli_bin())
            .arg(port.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Cli {
            child,
            stdin,
            lines,
        })
    }

    /// Writes one command line; its reply is read with `reply`.
    pub fn send(&mut self, line: &str) -> std::io::Result<()> {
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()
    }

    /// The next line of output (a one-line reply; nil is an empty line when the output is not a
    /// terminal), if one comes within `within`.
    pub fn reply(&self, within: Duration) -> Option<String> {
        self.lines.recv_timeout(within).ok()
    }

    /// Sends one command line and returns its one-line reply, trimmed; panics when none comes.
    pub fn command(&mut self, line: &str) -> String {
        self.send(line)
            .unwrap_or_else(|e| panic!("write {line:?} to redis-cli: {e}"));
        self.reply(REPLY_WITHIN)
            .unwrap_or_else(|| panic!("redis-cli did not answer {line:?}"))
            .trim_end()
            .to_string()
    }

    /// A command whose reply is an integer (a token, a client id).
    pub fn integer(&mut self, line: &str) -> i64 {
        let reply = self.command(line);
        reply
            .parse()
            .unwrap_or_else(|_| panic!("{line} answered {reply:?}"))
    }

    pub fn signal(&self, signal: Signal) {
        send_signal(self.child.id(), signal);
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        self.kill();
    }
}
