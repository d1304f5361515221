//! What the handles of one client share: where commands go, the shared connection, the
//! listener of the lost-hold signal, the keepers, the client's identity and settings. The
//! factory of handles (`client.rs`) makes it; handles use it and never see the client.

use std::time::Duration;

use crate::conn::Commands;
use crate::keeper::Keepers;
use crate::servers::Servers;
use crate::signal::SignalHub;
use crate::tickets::Tickets;
use std::sync::Arc;

pub(crate) struct Context {
    /// Where waiting acquires and `EPHEMERAL` holds open their own connections.
    pub(crate) servers: Servers,
    pub(crate) commands: Arc<Commands>,
    /// The client's random id: the prefix of its handles' owners.
    pub(crate) id: String,
    /// `CLIENT SETNAME` of the connections it opens to one node.
    pub(crate) name: String,
    /// The database its holds live in (0 in a cluster): signals about another are not ours.
    pub(crate) db: i64,
    pub(crate) command_timeout: Duration,
    /// Through Sentinel, how long an acquire is sent again while no master answers.
    pub(crate) failover_timeout: Duration,
    pub(crate) signals: Option<Arc<SignalHub>>,
    /// The lost-hold signal asked for by name: an acquire where the backend has none is
    /// refused.
    pub(crate) lost_signal_asked: bool,
    /// The waiting connection of acquires that wait with tickets (none: they wait on
    /// connections of their own).
    pub(crate) tickets: Option<Arc<Tickets>>,
    /// The tasks that renew this client's holds, one per runtime.
    pub(crate) keepers: Keepers,
}
