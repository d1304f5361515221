//! When the module may be unloaded.
//!
//! Redis 7.0 and Valkey 8 keep, for every client, a pointer to the last command it ran (shown by
//! `CLIENT LIST` as `cmd=`), and a transaction keeps pointers to its queued commands. Unloading
//! the module frees its commands, so either would then be read from freed memory: `CLIENT
//! LIST` crashed the server in the adversarial test, and an `EXEC` ran a freed `LOCK.INFO`. So
//! the unload waits until no client's last command is a LOCK.* command and no client is inside
//! `MULTI`. (Blocked waiters are refused separately: their callbacks point into the module.)

/// Reads `CLIENT LIST` and says why the module cannot be unloaded now, if it cannot.
pub fn blocker(client_list: &str) -> Option<&'static str> {
    for line in client_list.lines() {
        let field = |name: &str| line.split(' ').find_map(|f| f.strip_prefix(name));
        if field("cmd=").is_some_and(|cmd| cmd.starts_with("lock.")) {
            return Some("a connected client's last command was a LOCK.* command, which the server would keep pointing to after the unload; retry once it has sent another command or disconnected");
        }
        // `x` in the flags: inside MULTI (the `multi=` count is not enough: Valkey shows 0 for a
        // client that has left its transaction).
        if field("flags=").is_some_and(|flags| flags.contains('x')) {
            return Some("a client is inside MULTI (its queued commands may be LOCK.* commands); retry after its EXEC or DISCARD");
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(cmd: &str, flags: &str) -> String {
        let multi = if flags.contains('x') { "2" } else { "-1" };
        format!("id=7 addr=127.0.0.1:5 fd=9 name= age=0 idle=0 flags={flags} db=0 multi={multi} qbuf=0 cmd={cmd} user=default resp=2")
    }

    #[test]
    fn unload_waits_for_clients_that_still_point_at_lock_commands() {
        let cases = [
            (vec![client("module|unload", "N")], false),
            (vec![client("ping", "N"), client("client|list", "N")], false),
            (vec![client("lock.info", "N")], true),
            (vec![client("ping", "N"), client("lock.acquire", "N")], true),
            (vec![client("ping", "x")], true),
            // Valkey after DISCARD: out of the transaction, `multi=0`.
            (
                vec![client("discard", "N").replace("multi=-1", "multi=0")],
                false,
            ),
            (vec![client("block", "b")], false),
            (vec![], false),
        ];
        for (clients, blocked) in cases {
            let list = clients.join("\n");
            assert_eq!(blocker(&list).is_some(), blocked, "{list}");
        }
    }
}
