//! A connection that PINGs in a loop and keeps the slowest round trip: how long the server went
//! without answering its other clients while a test's batch, storm or fault ran.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redis::Value;

use crate::{eventually, RawClient, Server};

/// A reply this late is a stall: the pinger stops waiting for it.
const STALL: Duration = Duration::from_secs(10);
const SOON: Duration = Duration::from_secs(5);

/// What the pinger saw.
#[derive(Debug, Clone, Default)]
pub struct Pings {
    /// The slowest round trip (counting a PING still unanswered, up to now).
    pub worst: Duration,
    pub answered: u64,
    /// When a PING failed (no answer within `STALL`, the connection lost): why.
    pub failed: Option<String>,
    /// When the PING in flight was sent.
    pub in_flight: Option<Instant>,
}

/// A connection that PINGs in a tight loop from its own thread and keeps the slowest round
/// trip: the longest the server went without answering. It is subscribed to a channel first,
/// so that `CLIENT KILL TYPE normal` spares it (a subscribed RESP2 client may still PING).
pub struct Pinger {
    pings: Arc<Mutex<Pings>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Pinger {
    /// Returns once the first PING was answered.
    pub fn start(server: &Server) -> Pinger {
        let mut con = RawClient::connect(server.port).expect("the pinger connects");
        let subscribed = con.query(redis::cmd("SUBSCRIBE").arg("testkit:pinger"), SOON);
        assert!(
            matches!(subscribed, Ok(Value::Bulk(_))),
            "SUBSCRIBE: {subscribed:?}"
        );
        let pings = Arc::new(Mutex::new(Pings::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (pings, stop) = (pings.clone(), stop.clone());
            thread::spawn(move || {
                let ping = redis::cmd("PING");
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    pings.lock().unwrap().in_flight = Some(sent);
                    let reply = con.query(&ping, STALL);
                    let took = sent.elapsed();
                    let mut pings = pings.lock().unwrap();
                    pings.in_flight = None;
                    pings.worst = pings.worst.max(took);
                    match reply {
                        Ok(_) => pings.answered += 1,
                        Err(e) => {
                            pings.failed = Some(format!("PING after {took:?}: {e}"));
                            return;
                        }
                    }
                }
            })
        };
        let pinger = Pinger {
            pings,
            stop,
            thread: Some(thread),
        };
        assert!(
            eventually(SOON, || pinger.so_far().answered > 0),
            "the pinger got no PONG: {:?}",
            pinger.so_far()
        );
        pinger
    }

    /// The figures so far (an unanswered PING counts for how long it has waited).
    pub fn so_far(&self) -> Pings {
        let mut pings = self.pings.lock().unwrap().clone();
        if let Some(sent) = pings.in_flight {
            pings.worst = pings.worst.max(sent.elapsed());
        }
        pings
    }

    pub fn stop(mut self) -> Pings {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the pinger thread");
        }
        self.so_far()
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The longest the server may go without answering a PING while a batch or storm runs:
/// `$LOCK_PING_BOUND_MS`, else 600 ms. On the debug build (`make test`, the server matrix, a
/// plain `cargo test`) the bound is a stall check: at least 5x the worst PING measured there
/// (the 64-key batch: 55-75 ms, 103 ms with a second job on two cores; Valkey 8.1's libc
/// malloc: 109 ms in CI; the ticket storms 15-35 ms at 20,000 tickets). The module's target,
/// 100 ms, is `make scale`'s bound on the release build (`LOCK_PING_BOUND_MS=100`). Tests print
/// the figure either way.
pub fn ping_bound() -> Duration {
    let ms = std::env::var("LOCK_PING_BOUND_MS")
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("LOCK_PING_BOUND_MS={v:?} is not a number"))
        })
        .unwrap_or(600);
    Duration::from_millis(ms)
}
