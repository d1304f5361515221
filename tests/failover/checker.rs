//! The failover test's checker: the drivers' lines (every acknowledged hold with its token and
//! client-side interval, every acquire left unanswered or answered an error), the truth poller's
//! reads of the current master, and the injector's failovers in; the cases of each measure out.
//!
//! Every time is wall-clock epoch milliseconds: the drivers, the poller and the injector run on
//! one machine and read one clock.

use std::collections::{HashMap, HashSet};

use super::json::{parse_object, Json};

/// Rust's driver writes whole milliseconds, Python's fractions: intervals closer than this are
/// not taken for overlapping, nor a read this close to a grant for one made after it.
pub const TOLERANCE_MS: f64 = 1.0;

/// Two holds that may be held together (two readers, two permits) are ordered by their
/// acknowledgements only when this far apart: a grant's acknowledgement can come late (a
/// `WAIT` for a replica, a paused master resumed), but not this late.
pub const UNORDERED_MARGIN_MS: f64 = 10_000.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lib {
    Rust,
    Python,
}

impl Lib {
    pub const ALL: [Lib; 2] = [Lib::Rust, Lib::Python];

    pub fn name(self) -> &'static str {
        match self {
            Lib::Rust => "rust",
            Lib::Python => "python",
        }
    }

    fn parse(s: &str) -> Option<Lib> {
        match s {
            "rust" => Some(Lib::Rust),
            "python" => Some(Lib::Python),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Exclusive,
    Shared,
    Permit,
    /// An exclusive hold taken `EPHEMERAL` (bound to a connection of its guard's own).
    Ephemeral,
    /// A leadership (`EPHEMERAL`, as elections are by default).
    Leader,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Exclusive,
        Kind::Shared,
        Kind::Permit,
        Kind::Ephemeral,
        Kind::Leader,
    ];

    fn parse(s: &str) -> Option<Kind> {
        match s {
            "exclusive" => Some(Kind::Exclusive),
            "shared" => Some(Kind::Shared),
            "permit" => Some(Kind::Permit),
            "ephemeral" => Some(Kind::Ephemeral),
            "leader" => Some(Kind::Leader),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Exclusive => "exclusive",
            Kind::Shared => "shared",
            Kind::Permit => "permit",
            Kind::Ephemeral => "ephemeral",
            Kind::Leader => "leader",
        }
    }

    fn exclusive(self) -> bool {
        matches!(self, Kind::Exclusive | Kind::Ephemeral | Kind::Leader)
    }

    /// Whether two holds of these kinds on one key may not be held at once: an exclusive hold
    /// or a leadership excludes every other hold, a shared one excludes exclusive ones.
    /// (Permits are counted against their limit instead.)
    pub fn excludes(self, other: Kind) -> bool {
        self.exclusive() || other.exclusive()
    }
}

/// One acknowledged hold, as its driver wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    pub lib: Lib,
    pub replicas: u8,
    pub key: String,
    pub kind: Kind,
    pub limit: Option<usize>,
    pub owner: String,
    pub token: i64,
    /// When the grant was handed to the application (after the replicas' acknowledgement).
    pub start: f64,
    /// When the application stopped believing it held.
    pub end: f64,
    /// `released`, `lost:<reason>`, `run-end`.
    pub how: String,
    /// When the acquire was sent, if the driver says (`asked_ms`).
    pub asked: Option<f64>,
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {:?} token {} [{:.0} .. {:.0}] ({:.0} ms, {}) on {}",
            self.lib.name(),
            self.kind.name(),
            self.owner,
            self.token,
            self.start,
            self.end,
            self.end - self.start,
            self.how,
            self.key
        )
    }
}

/// An acquire that never got an answer, or got an error.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub lib: Lib,
    pub replicas: u8,
    pub key: String,
    pub kind: String,
    pub owner: String,
    pub at: f64,
    /// None: unanswered; Some: the error.
    pub error: Option<String>,
}

/// What the drivers wrote.
#[derive(Debug, Default)]
pub struct Lines {
    pub holds: Vec<Hold>,
    pub events: Vec<Event>,
    /// Lines that could not be read, with why.
    pub unreadable: Vec<String>,
}

impl Lines {
    pub fn read(&mut self, text: &str) {
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if let Err(why) = self.read_line(line) {
                self.unreadable.push(format!("{why}: {line}"));
            }
        }
    }

    fn read_line(&mut self, line: &str) -> Result<(), String> {
        let o = parse_object(line)?;
        let text = |name: &str| -> Result<String, String> {
            o.get(name)
                .and_then(Json::str)
                .map(str::to_string)
                .ok_or_else(|| format!("no {name}"))
        };
        let number = |name: &str| -> Result<f64, String> {
            o.get(name)
                .and_then(Json::float)
                .ok_or_else(|| format!("no {name}"))
        };
        let lib = Lib::parse(&text("lib")?).ok_or("unknown lib")?;
        let replicas = o
            .get("replicas")
            .and_then(Json::int)
            .and_then(|r| u8::try_from(r).ok())
            .ok_or("no replicas")?;
        if let Some(event) = o.get("event").and_then(Json::str) {
            // Python's driver names the time of an error `ms`, Rust's `at_ms`; an unanswered
            // acquire's `start_ms` is when it was sent.
            let at = ["start_ms", "at_ms", "ms"]
                .iter()
                .find_map(|n| o.get(*n).and_then(Json::float))
                .unwrap_or(0.0);
            let error = match event {
                "unanswered" => None,
                "acquire-error" => Some(text("error")?),
                other => return Err(format!("unknown event {other}")),
            };
            self.events.push(Event {
                lib,
                replicas,
                key: text("key").unwrap_or_default(),
                kind: text("kind").unwrap_or_default(),
                owner: text("owner").unwrap_or_default(),
                at,
                error,
            });
            return Ok(());
        }
        let kind = Kind::parse(&text("kind")?).ok_or("unknown kind")?;
        self.holds.push(Hold {
            lib,
            replicas,
            key: text("key")?,
            kind,
            limit: o
                .get("limit")
                .and_then(Json::int)
                .and_then(|l| usize::try_from(l).ok()),
            owner: text("owner")?,
            token: o.get("token").and_then(Json::int).ok_or("no token")?,
            start: number("start_ms")?,
            end: number("end_ms")?,
            how: text("end")?,
            asked: o.get("asked_ms").and_then(Json::float),
        });
        Ok(())
    }
}

/// Two acknowledged holds of one key that exclude each other and were believed at once.
#[derive(Debug, Clone)]
pub struct Overlap {
    pub first: Hold,
    pub second: Hold,
}

impl Overlap {
    pub fn ms(&self) -> f64 {
        self.first.end.min(self.second.end) - self.second.start
    }
}

/// More permits believed at once than the semaphore's limit.
#[derive(Debug, Clone)]
pub struct Crowd {
    pub key: String,
    pub limit: usize,
    pub at: f64,
    pub holds: Vec<Hold>,
}

fn by_key<'a>(holds: &[&'a Hold]) -> HashMap<&'a str, Vec<&'a Hold>> {
    let mut keys: HashMap<&str, Vec<&Hold>> = HashMap::new();
    for h in holds {
        keys.entry(h.key.as_str()).or_default().push(h);
    }
    for list in keys.values_mut() {
        list.sort_by(|a, b| a.start.total_cmp(&b.start));
    }
    keys
}

/// Overlapping acknowledged holds: two that exclude each other believed at once (by more
/// than [`TOLERANCE_MS`]), and every moment more permits than the limit were believed.
pub fn overlaps(holds: &[&Hold], default_limit: usize) -> (Vec<Overlap>, Vec<Crowd>) {
    let mut pairs = Vec::new();
    let mut crowds = Vec::new();
    for (key, list) in by_key(holds) {
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if b.start + TOLERANCE_MS >= a.end {
                    break;
                }
                if a.kind.excludes(b.kind) {
                    pairs.push(Overlap {
                        first: (*a).clone(),
                        second: (*b).clone(),
                    });
                }
            }
        }
        let permits: Vec<&Hold> = list
            .iter()
            .copied()
            .filter(|h| h.kind == Kind::Permit)
            .collect();
        let limit = permits
            .iter()
            .find_map(|h| h.limit)
            .unwrap_or(default_limit);
        // A sweep: each hold from its start to its end (less the tolerance); ends first.
        let mut edges: Vec<(f64, bool, usize)> = Vec::new();
        for (n, h) in permits.iter().enumerate() {
            let end = h.end - TOLERANCE_MS;
            if end > h.start {
                edges.push((h.start, true, n));
                edges.push((end, false, n));
            }
        }
        edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut active: Vec<usize> = Vec::new();
        let mut crowded = false;
        for (at, starts, n) in edges {
            if starts {
                active.push(n);
                if active.len() > limit && !crowded {
                    crowded = true;
                    crowds.push(Crowd {
                        key: key.to_string(),
                        limit,
                        at,
                        holds: active.iter().map(|&i| permits[i].clone()).collect(),
                    });
                }
            } else {
                active.retain(|&i| i != n);
                crowded = active.len() > limit;
            }
        }
    }
    pairs.sort_by(|a, b| a.second.start.total_cmp(&b.second.start));
    crowds.sort_by(|a, b| a.at.total_cmp(&b.at));
    (pairs, crowds)
}

/// A token that did not rise: `later`'s grant came after `earlier`'s (and `earlier` was over,
/// or asked for before, as `why` says), yet its token is not above it; or a token handed out
/// twice.
#[derive(Debug, Clone)]
pub struct TokenCase {
    pub earlier: Hold,
    pub later: Hold,
    pub why: &'static str,
}

/// Tokens that did not rise, per key: each grant's token must be above every earlier grant's
/// of that key. "Earlier" on the evidence the drivers give: a hold that excludes the later one
/// and whose application stopped believing before the later one's grant was acknowledged;
/// any hold acknowledged before the later one was asked for (`asked_ms`), or, from a driver
/// that does not write when it asked, any hold over [`UNORDERED_MARGIN_MS`] before it. And no
/// token twice.
///
/// A token handed out again to its own owner is counted apart (the second number), not as a
/// case: a release the old master answered but had not replicated when it died is undone by the
/// failover, and the owner's next acquire (`ONCE`) is answered with the hold the new master still
/// has. Nobody else held the key in between (an acknowledged grant to another would have
/// carried the release to the replicas before it).
///
/// And a hold some server already had before its acquire was called (the spies read it) is no
/// new grant either: an earlier acquire of that owner that never reached the application (an
/// unsafe grant whose release was lost with a master) is answered again as a re-entry.
pub fn token_cases(holds: &[&Hold], truth: &Truth) -> (Vec<TokenCase>, usize) {
    let first_seen = truth.first_seen();
    let mut cases = Vec::new();
    let mut resumed = 0;
    for list in by_key(holds).into_values() {
        let mut seen: HashMap<i64, &Hold> = HashMap::new();
        for h in &list {
            if let Some(first) = seen.insert(h.token, h) {
                if first.owner == h.owner {
                    resumed += 1;
                    continue;
                }
                cases.push(TokenCase {
                    earlier: first.clone(),
                    later: (*h).clone(),
                    why: "the same token handed out twice",
                });
            }
        }
        for later in &list {
            // A hold given back to its owner is no new grant: its token is as old as the hold.
            if list
                .iter()
                .any(|e| e.start < later.start && e.owner == later.owner && e.token == later.token)
            {
                continue;
            }
            let seen = truth
                .key_index(&later.key)
                .and_then(|k| first_seen.get(&(k, later.owner.as_str(), later.token)));
            if let (Some(seen), Some(asked)) = (seen, later.asked) {
                if *seen + TOLERANCE_MS < asked {
                    resumed += 1;
                    continue;
                }
            }
            let mut worst: Option<(&Hold, &'static str)> = None;
            for earlier in &list {
                if earlier.token < later.token || std::ptr::eq(*earlier, *later) {
                    continue;
                }
                let why = if earlier.kind.excludes(later.kind)
                    && earlier.end + TOLERANCE_MS <= later.start
                {
                    "the earlier hold was over before the later one was acknowledged"
                } else if later.asked.is_none() && earlier.end + UNORDERED_MARGIN_MS <= later.start
                {
                    "the earlier hold was over 10 s before the later one was acknowledged"
                } else if later
                    .asked
                    .is_some_and(|asked| earlier.start + TOLERANCE_MS <= asked)
                {
                    // Its grant (and token) came after the earlier one's: a hold's grant lies
                    // between the acquire's call and its answer.
                    "the earlier hold was acknowledged before the later one was asked for"
                } else {
                    continue;
                };
                if earlier.token == later.token {
                    continue; // reported above
                }
                if worst.is_none_or(|(w, _)| earlier.token > w.token) {
                    worst = Some((earlier, why));
                }
            }
            if let Some((earlier, why)) = worst {
                cases.push(TokenCase {
                    earlier: earlier.clone(),
                    later: (*later).clone(),
                    why,
                });
            }
        }
    }
    cases.sort_by(|a, b| a.later.start.total_cmp(&b.later.start));
    (cases, resumed)
}

/// One read of every key on the master the Sentinels named.
#[derive(Debug, Clone)]
pub struct Round {
    /// When the read was sent.
    pub sent: f64,
    pub port: u16,
    /// Per key (in the truth's key order), the holders: (owner, token).
    pub holders: Vec<Vec<(String, i64)>>,
}

/// What the truth poller read, in the order it read it.
#[derive(Debug, Clone, Default)]
pub struct Truth {
    pub keys: Vec<String>,
    pub rounds: Vec<Round>,
    /// Every data server read on its own (whatever the Sentinels say), with its `ROLE` as
    /// text: for the story of a case.
    pub spied: Vec<(String, Round)>,
}

impl Truth {
    /// Where and when a hold was read: per server and role, the first and last read listing it.
    pub fn sightings(&self, h: &Hold) -> Vec<String> {
        let Some(k) = self.key_index(&h.key) else {
            return Vec::new();
        };
        let mut out: Vec<(u16, String, f64, f64)> = Vec::new();
        for (role, r) in &self.spied {
            let listed = r
                .holders
                .get(k)
                .is_some_and(|l| l.iter().any(|(o, t)| *o == h.owner && *t == h.token));
            if !listed {
                continue;
            }
            match out
                .iter_mut()
                .find(|(p, w, _, _)| *p == r.port && w == role)
            {
                Some(entry) => entry.3 = r.sent,
                None => out.push((r.port, role.clone(), r.sent, r.sent)),
            }
        }
        out.into_iter()
            .map(|(p, role, a, b)| format!("{p} ({role}) {a:.0}..{b:.0}"))
            .collect()
    }

    /// Every other token the spies read for a hold's owner on its key between two moments:
    /// (server, role, token, first read, last read).
    pub fn owner_tokens(&self, h: &Hold, from: f64, to: f64) -> Vec<String> {
        let Some(k) = self.key_index(&h.key) else {
            return Vec::new();
        };
        let mut out: Vec<(u16, String, i64, f64, f64)> = Vec::new();
        for (role, r) in self
            .spied
            .iter()
            .filter(|(_, r)| r.sent >= from && r.sent <= to)
        {
            let role = role.split(' ').next().unwrap_or_default().to_string();
            for (owner, token) in r.holders.get(k).into_iter().flatten() {
                if *owner != h.owner || *token == h.token {
                    continue;
                }
                match out
                    .iter_mut()
                    .find(|e| e.0 == r.port && e.1 == role && e.2 == *token)
                {
                    Some(e) => e.4 = r.sent,
                    None => out.push((r.port, role.clone(), *token, r.sent, r.sent)),
                }
            }
        }
        out.into_iter()
            .map(|(p, role, t, a, b)| format!("{p} ({role}) token {t} {a:.0}..{b:.0}"))
            .collect()
    }

    /// When the spies first read each (key, owner, token), on any server.
    pub fn first_seen(&self) -> HashMap<(usize, &str, i64), f64> {
        let mut seen: HashMap<(usize, &str, i64), f64> = HashMap::new();
        for (_, round) in &self.spied {
            for (k, holders) in round.holders.iter().enumerate() {
                for (owner, token) in holders {
                    seen.entry((k, owner.as_str(), *token))
                        .or_insert(round.sent);
                }
            }
        }
        seen
    }

    /// What the current master was read holding on `key` between two moments: each change
    /// (of the master, or of the key's holders), as `ms port: owner token, ...`.
    pub fn key_story(&self, key: &str, from: f64, to: f64) -> Vec<String> {
        let Some(k) = self.key_index(key) else {
            return Vec::new();
        };
        let mut last: Option<(u16, &Vec<(String, i64)>)> = None;
        let mut out = Vec::new();
        for r in self
            .rounds
            .iter()
            .filter(|r| r.sent >= from && r.sent <= to)
        {
            let Some(holders) = r.holders.get(k) else {
                continue;
            };
            if last != Some((r.port, holders)) {
                let list: Vec<String> = holders.iter().map(|(o, t)| format!("{o} {t}")).collect();
                out.push(format!("{:.0} {}: [{}]", r.sent, r.port, list.join(", ")));
                last = Some((r.port, holders));
            }
        }
        out
    }

    /// What the spies read of one server between two moments (role changes only).
    pub fn roles(&self, from: f64, to: f64) -> Vec<String> {
        let mut last: HashMap<u16, String> = HashMap::new();
        let mut out = Vec::new();
        for (role, r) in &self.spied {
            if r.sent < from || r.sent > to {
                continue;
            }
            // Offsets change all the time: a change of role or replicas only.
            let role = role
                .split(' ')
                .map(|w| w.split('@').next().unwrap_or(w))
                .collect::<Vec<_>>()
                .join(" ");
            if last.insert(r.port, role.clone()).as_ref() != Some(&role) {
                out.push(format!("{:.0} {}: {role}", r.sent, r.port));
            }
        }
        out
    }
}

impl Truth {
    fn key_index(&self, key: &str) -> Option<usize> {
        self.keys.iter().position(|k| k == key)
    }

    /// Every master each (key, owner, token) was read on.
    fn seen_on(&self) -> HashMap<(usize, &str, i64), HashSet<u16>> {
        let mut seen: HashMap<(usize, &str, i64), HashSet<u16>> = HashMap::new();
        for round in &self.rounds {
            for (k, holders) in round.holders.iter().enumerate() {
                for (owner, token) in holders {
                    seen.entry((k, owner.as_str(), *token))
                        .or_default()
                        .insert(round.port);
                }
            }
        }
        seen
    }
}

/// A hold its application still believed after the current master was read without it.
#[derive(Debug, Clone)]
pub struct Belief {
    pub hold: Hold,
    /// When the first read that did not find it was sent.
    pub gone: f64,
    pub port: u16,
}

impl Belief {
    /// How long the application believed it past that read.
    pub fn ms(&self) -> f64 {
        self.hold.end - self.gone
    }
}

/// For each hold, the first read of the current master sent after its grant was acknowledged
/// that does not list it (owner and token); a case when its application believed it after.
pub fn beliefs(holds: &[&Hold], truth: &Truth) -> Vec<Belief> {
    let mut out = Vec::new();
    for h in holds {
        let Some(k) = truth.key_index(&h.key) else {
            continue;
        };
        let from = truth
            .rounds
            .partition_point(|r| r.sent < h.start + TOLERANCE_MS);
        let gone = truth.rounds[from..]
            .iter()
            .take_while(|r| r.sent < h.end)
            .find(|r| {
                !r.holders
                    .get(k)
                    .is_some_and(|list| list.iter().any(|(o, t)| *o == h.owner && *t == h.token))
            });
        if let Some(r) = gone {
            out.push(Belief {
                hold: (*h).clone(),
                gone: r.sent,
                port: r.port,
            });
        }
    }
    out.sort_by(|a, b| b.ms().total_cmp(&a.ms()));
    out
}

/// A failover the injector caused.
#[derive(Debug, Clone)]
pub struct Failover {
    /// `kill` (SIGKILL, restarted later) or `pause` (SIGSTOP, SIGCONT later).
    pub how: &'static str,
    pub old: u16,
    pub new: u16,
    /// The signal sent.
    pub death: f64,
    /// Every Sentinel names the new master, and it says it is one.
    pub named: f64,
    /// The old master restarted, or continued.
    pub back: f64,
}

/// The first grant on the new master after each failover's death, of the holds given: the
/// earliest acknowledged after the death (and before the next death) that the poller read on
/// the new master. None when there was none.
pub fn first_grants(holds: &[&Hold], truth: &Truth, failovers: &[Failover]) -> Vec<Option<f64>> {
    let seen = truth.seen_on();
    failovers
        .iter()
        .enumerate()
        .map(|(n, f)| {
            let until = failovers.get(n + 1).map_or(f64::MAX, |next| next.death);
            holds
                .iter()
                .filter(|h| h.start > f.death && h.start < until)
                .filter(|h| {
                    truth.key_index(&h.key).is_some_and(|k| {
                        seen.get(&(k, h.owner.as_str(), h.token))
                            .is_some_and(|ports| ports.contains(&f.new))
                    })
                })
                .map(|h| h.start - f.death)
                .min_by(f64::total_cmp)
        })
        .collect()
}

/// How soon one library's holds of one kind were granted again after the failovers.
#[derive(Debug, Clone)]
pub struct Recovery {
    pub lib: Lib,
    pub kind: Kind,
    /// Per failover: from the death to the first grant of this library and kind read on the
    /// new master (ms), if there was one before the next death.
    pub after_death: Vec<Option<f64>>,
    /// Per failover: whether the run left room to expect one ([`Recovery::late`]'s window
    /// ended before the next death and before the drivers stopped).
    pub expected: Vec<bool>,
    /// The failovers (by index) with no grant within the switch time plus the margin.
    pub late: Vec<usize>,
}

impl Recovery {
    /// The first grants after the switch (death to grant, less death to every Sentinel
    /// naming the new master), in ms.
    pub fn after_switch(&self, failovers: &[Failover]) -> Vec<f64> {
        self.after_death
            .iter()
            .zip(failovers)
            .filter_map(|(g, f)| g.map(|g| g - (f.named - f.death)))
            .collect()
    }
}

/// Per library and kind, the first grant on the new master after each failover (see
/// [`first_grants`]), and the failovers after which none came within `margin_ms` of every
/// Sentinel naming the new master. A failover counts only when that window closed before the
/// next death and before `run_end` (the drivers stop asking then).
pub fn recoveries(
    holds: &[&Hold],
    truth: &Truth,
    failovers: &[Failover],
    run_end: f64,
    margin_ms: f64,
) -> Vec<Recovery> {
    let mut out = Vec::new();
    for lib in Lib::ALL {
        for kind in Kind::ALL {
            let mine: Vec<&Hold> = holds
                .iter()
                .copied()
                .filter(|h| h.lib == lib && h.kind == kind)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let after_death = first_grants(&mine, truth, failovers);
            let mut expected = Vec::new();
            let mut late = Vec::new();
            for (n, (f, g)) in failovers.iter().zip(&after_death).enumerate() {
                let until = failovers.get(n + 1).map_or(run_end, |next| next.death);
                let window = f.named + margin_ms;
                let counts = window <= until;
                expected.push(counts);
                if counts && g.is_none_or(|g| f.death + g > window) {
                    late.push(n);
                }
            }
            out.push(Recovery {
                lib,
                kind,
                after_death,
                expected,
                late,
            });
        }
    }
    out
}

/// (min, median, max) of some durations.
pub fn spread(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    Some((*v.first()?, v[v.len() / 2], *v.last()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(kind: Kind, owner: &str, token: i64, start: f64, end: f64) -> Hold {
        Hold {
            lib: Lib::Rust,
            replicas: 1,
            key: "k".into(),
            kind,
            limit: (kind == Kind::Permit).then_some(2),
            owner: owner.into(),
            token,
            start,
            end,
            how: "released".into(),
            asked: None,
        }
    }

    #[test]
    fn overlaps_count_holds_that_exclude_each_other_and_crowded_permits() {
        let holds = [
            hold(Kind::Shared, "r1", 1, 0.0, 100.0),
            hold(Kind::Shared, "r2", 2, 50.0, 150.0), // readers together: fine
            hold(Kind::Exclusive, "w", 3, 140.0, 200.0), // a writer inside a reader: a case
            hold(Kind::Exclusive, "w2", 4, 200.5, 300.0), // within the tolerance: fine
        ];
        let (pairs, crowds) = overlaps(&holds.iter().collect::<Vec<_>>(), 2);
        assert_eq!(pairs.len(), 1);
        assert_eq!((pairs[0].first.token, pairs[0].second.token), (2, 3));
        assert!(crowds.is_empty());

        let permits = [
            hold(Kind::Permit, "a", 1, 0.0, 100.0),
            hold(Kind::Permit, "b", 2, 10.0, 100.0),
            hold(Kind::Permit, "c", 3, 20.0, 30.0),
            hold(Kind::Permit, "d", 4, 100.0, 130.0),
        ];
        let (pairs, crowds) = overlaps(&permits.iter().collect::<Vec<_>>(), 2);
        assert!(pairs.is_empty());
        assert_eq!(crowds.len(), 1);
        assert_eq!(crowds[0].holds.len(), 3);
    }

    #[test]
    fn a_kind_with_no_grant_within_the_switch_and_the_margin_is_late() {
        // Two failovers: named 3 s after each death; the margin 5 s.
        let failovers = [0.0, 20_000.0].map(|death| Failover {
            how: "kill",
            old: 1,
            new: 2,
            death,
            named: death + 3_000.0,
            back: death + 4_000.0,
        });
        let mut truth = Truth {
            keys: vec!["k".into()],
            ..Truth::default()
        };
        let read = |truth: &mut Truth, sent: f64, owner: &str, token: i64| {
            truth.rounds.push(Round {
                sent,
                port: 2,
                holders: vec![vec![(owner.to_string(), token)]],
            })
        };
        // Exclusive: granted 3.5 s after the first death, 7.9 s after the second (in time);
        // leader: 4 s after the first, then only after a lease (15 s): late.
        let holds = [
            hold(Kind::Exclusive, "a", 1, 3_500.0, 3_600.0),
            hold(Kind::Exclusive, "a", 2, 27_900.0, 28_000.0),
            hold(Kind::Leader, "b", 3, 4_000.0, 4_100.0),
            hold(Kind::Leader, "b", 4, 35_000.0, 35_100.0),
        ];
        for h in &holds {
            read(&mut truth, h.start + 10.0, &h.owner, h.token);
        }
        let all: Vec<&Hold> = holds.iter().collect();
        let found = recoveries(&all, &truth, &failovers, 60_000.0, 5_000.0);
        let by_kind = |kind: Kind| found.iter().find(|r| r.kind == kind).unwrap();
        let exclusive = by_kind(Kind::Exclusive);
        assert_eq!(exclusive.after_death, [Some(3_500.0), Some(7_900.0)]);
        assert!(exclusive.late.is_empty());
        assert_eq!(exclusive.after_switch(&failovers), [500.0, 4_900.0]);
        let leader = by_kind(Kind::Leader);
        assert_eq!(leader.late, [1]);
        // A window the run's end cut short is not expected to hold a grant.
        let cut = recoveries(&all, &truth, &failovers, 26_000.0, 5_000.0);
        let leader = cut.iter().find(|r| r.kind == Kind::Leader).unwrap();
        assert_eq!(leader.expected, [true, false]);
        assert!(leader.late.is_empty());
    }

    #[test]
    fn a_token_must_rise_past_every_earlier_hold_but_may_come_back_to_its_owner() {
        let holds = [
            hold(Kind::Exclusive, "a", 10, 0.0, 100.0),
            hold(Kind::Exclusive, "b", 5, 200.0, 300.0), // after a's hold, lower: a case
            hold(Kind::Exclusive, "c", 20, 400.0, 500.0),
            hold(Kind::Exclusive, "c", 20, 600.0, 700.0), // its own hold given back: counted apart
            hold(Kind::Exclusive, "d", 20, 800.0, 900.0), // another owner's token: a case
            Hold {
                asked: Some(1_000.0), // asked after c's hold, yet given back to its owner e...
                ..hold(Kind::Exclusive, "e", 1, 1_100.0, 1_200.0)
            },
        ];
        let mut holds = holds.to_vec();
        // ... whose first hold of that token came before: no case.
        holds.insert(0, hold(Kind::Exclusive, "e", 1, -100.0, -50.0));
        let (cases, resumed) = token_cases(&holds.iter().collect::<Vec<_>>(), &Truth::default());
        assert_eq!(resumed, 2);
        let found: Vec<(i64, &str)> = cases
            .iter()
            .map(|c| (c.later.token, c.later.owner.as_str()))
            .collect();
        assert_eq!(found, [(5, "b"), (20, "d")]);
    }
}
