//! Where a Redis Cluster slot is served, read from `CLUSTER NODES`.
//!
//! Waiters are blocked on one node. When their lock key leaves that node (MIGRATE during a
//! reshard, or the slot reassigned), handing the lock to them there would create a second copy
//! of the lock beside the migrated one. So before a handoff that was not caused by a LOCK.*
//! command, the module asks where the slot lives now and, if it is no longer here, answers the
//! waiters with the redirect a cluster client follows (`ASK` / `MOVED`), as Redis does for keys.

/// Where requests for a slot must go, as seen by this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotRoute {
    /// This node serves the slot (it owns it, or is importing it).
    Here,
    /// The slot is migrating to the node at this address: keys missing here are there now.
    Ask(String),
    /// Another node owns the slot.
    Moved(String),
    /// No node serves the slot.
    Unassigned,
}

impl SlotRoute {
    /// The error a waiter is answered with, in Redis's words; None when the slot is served here.
    pub fn redirect(&self, slot: u16) -> Option<String> {
        match self {
            SlotRoute::Here => None,
            SlotRoute::Ask(addr) => Some(format!("ASK {slot} {addr}")),
            SlotRoute::Moved(addr) => Some(format!("MOVED {slot} {addr}")),
            SlotRoute::Unassigned => Some("CLUSTERDOWN Hash slot not served".to_string()),
        }
    }
}

struct Node<'a> {
    id: &'a str,
    addr: &'a str,
    myself: bool,
    master: bool,
    slots: Vec<&'a str>,
}

fn parse_line(line: &str) -> Option<Node<'_>> {
    let mut fields = line.split_whitespace();
    let id = fields.next()?;
    let endpoint = fields.next()?;
    let flags = fields.next()?;
    // master id, ping-sent, pong-recv, config-epoch, link-state
    let slots: Vec<&str> = fields.skip(5).collect();
    let addr = endpoint.split(['@', ',']).next().unwrap_or(endpoint);
    let flags: Vec<&str> = flags.split(',').collect();
    Some(Node {
        id,
        addr,
        myself: flags.contains(&"myself"),
        master: flags.contains(&"master"),
        slots,
    })
}

/// Whether a `CLUSTER NODES` slot entry (`5`, `0-5460`) covers `slot`. Migration entries
/// (`[5->-id]`) are not ranges and do not match.
fn covers(entry: &str, slot: u16) -> bool {
    let (low, high) = entry.split_once('-').unwrap_or((entry, entry));
    match (low.parse::<u16>(), high.parse::<u16>()) {
        (Ok(low), Ok(high)) => (low..=high).contains(&slot),
        _ => false,
    }
}

/// A migration entry of `slot` on this node: `[slot->-id]` (migrating) or `[slot-<-id]`
/// (importing). Returns (migrating, other node id).
fn migration(entry: &str, slot: u16) -> Option<(bool, &str)> {
    let inner = entry.strip_prefix('[')?.strip_suffix(']')?;
    let (at, rest) = inner.split_once('-')?;
    if at.parse::<u16>().ok()? != slot {
        return None;
    }
    if let Some(id) = rest.strip_prefix(">-") {
        Some((true, id))
    } else {
        rest.strip_prefix("<-").map(|id| (false, id))
    }
}

/// Reads `CLUSTER NODES` output and says where `slot` is served, from this node's view.
pub fn route(cluster_nodes: &str, slot: u16) -> SlotRoute {
    let nodes: Vec<Node<'_>> = cluster_nodes.lines().filter_map(parse_line).collect();
    let address_of = |id: &str| {
        nodes
            .iter()
            .find(|n| n.id == id)
            .map(|n| n.addr.to_string())
    };
    let Some(me) = nodes.iter().find(|n| n.myself) else {
        // Not a cluster node's output: nothing to redirect to.
        return SlotRoute::Here;
    };
    for entry in &me.slots {
        match migration(entry, slot) {
            Some((true, target)) => {
                return address_of(target).map_or(SlotRoute::Unassigned, SlotRoute::Ask)
            }
            Some((false, _)) => return SlotRoute::Here,
            None => {}
        }
    }
    if me.slots.iter().any(|e| covers(e, slot)) {
        return SlotRoute::Here;
    }
    nodes
        .iter()
        .find(|n| n.master && !n.myself && n.slots.iter().any(|e| covers(e, slot)))
        .map_or(SlotRoute::Unassigned, |n| {
            SlotRoute::Moved(n.addr.to_string())
        })
}

/// Whether this node serves `slot` settled: it owns the slot and is moving it nowhere. Only
/// then may a missing token counter be begun here (`crate::token::Counter`): while the slot is
/// migrating or importing, or owned by another node, its counter may be on the other node.
/// Output that does not name this node is not settled: nothing here says where the slot is.
pub fn settled_here(cluster_nodes: &str, slot: u16) -> bool {
    let Some(me) = cluster_nodes
        .lines()
        .filter_map(parse_line)
        .find(|n| n.myself)
    else {
        return false;
    };
    me.master
        && !me.slots.iter().any(|e| migration(e, slot).is_some())
        && me.slots.iter().any(|e| covers(e, slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "\
aaa 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [5461-<-bbb] [100->-ccc]
bbb 127.0.0.1:7001@17001,host-b master - 0 1700000000000 2 connected 5461-10922
ccc 127.0.0.1:7002@17002 master - 0 1700000000000 3 connected 10923-16382
ddd 127.0.0.1:7003@17003 slave aaa 0 1700000000000 1 connected
";

    #[test]
    fn routes_every_kind_of_slot() {
        let cases = [
            (0, SlotRoute::Here),
            (5460, SlotRoute::Here),
            // Importing from bbb: served here (with ASKING).
            (5461, SlotRoute::Here),
            // Migrating to ccc: a key missing here is there.
            (100, SlotRoute::Ask("127.0.0.1:7002".into())),
            (5462, SlotRoute::Moved("127.0.0.1:7001".into())),
            (16382, SlotRoute::Moved("127.0.0.1:7002".into())),
            (16383, SlotRoute::Unassigned),
        ];
        for (slot, want) in cases {
            assert_eq!(route(NODES, slot), want, "slot {slot}");
        }
    }

    #[test]
    fn a_slot_is_settled_only_where_it_is_owned_and_moving_nowhere() {
        let cases = [
            (0, true),
            (5460, true),
            // Importing from bbb: its counter may not have arrived.
            (5461, false),
            // Migrating to ccc: its counter may have left.
            (100, false),
            // Owned by another node, or by none.
            (5462, false),
            (16383, false),
        ];
        for (slot, want) in cases {
            assert_eq!(settled_here(NODES, slot), want, "slot {slot}");
        }
        assert!(!settled_here("", 0));
        assert!(!settled_here("garbage\n x y", 0));
        let replica = "ddd 127.0.0.1:7003@17003 myself,slave aaa 0 0 1 connected";
        assert!(!settled_here(replica, 0));
    }

    #[test]
    fn redirects_read_like_redis_errors() {
        assert_eq!(SlotRoute::Here.redirect(1), None);
        assert_eq!(
            SlotRoute::Ask("127.0.0.1:7002".into())
                .redirect(100)
                .as_deref(),
            Some("ASK 100 127.0.0.1:7002")
        );
        assert_eq!(
            SlotRoute::Moved("10.0.0.1:6379".into())
                .redirect(7)
                .as_deref(),
            Some("MOVED 7 10.0.0.1:6379")
        );
        assert!(SlotRoute::Unassigned
            .redirect(7)
            .is_some_and(|e| e.starts_with("CLUSTERDOWN")));
    }

    #[test]
    fn output_without_this_node_or_garbage_never_redirects() {
        assert_eq!(route("", 5), SlotRoute::Here);
        assert_eq!(route("garbage\n\n x y", 5), SlotRoute::Here);
        let migrating_to_unknown = "aaa 1.2.3.4:1@2 myself,master - 0 0 1 connected [5->-zzz]";
        assert_eq!(route(migrating_to_unknown, 5), SlotRoute::Unassigned);
    }
}
