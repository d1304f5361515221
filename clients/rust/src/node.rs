//! One server a client connects to: its address and settings, as a client for each protocol.

use redis::{ConnectionAddr, ConnectionInfo, ProtocolVersion};

use crate::error::LockError;

/// One node, as a client for RESP2 connections (waiting acquires) and one for RESP3 connections
/// (those that need pushes: `EPHEMERAL` holds).
#[derive(Clone)]
pub(crate) struct Node {
    pub(crate) client: redis::Client,
    pub(crate) resp3: redis::Client,
}

impl Node {
    /// The node of `info` (its address and settings, the protocol of `info` for the first
    /// client), with the library's name.
    pub(crate) fn from_info(info: ConnectionInfo) -> Result<Node, LockError> {
        let settings = crate::naming::with_lib_name(info.redis_settings().clone());
        let resp3 = settings.clone().set_protocol(ProtocolVersion::RESP3);
        Ok(Node {
            client: redis::Client::open(info.clone().set_redis_settings(settings))
                .map_err(LockError::Connection)?,
            resp3: redis::Client::open(info.set_redis_settings(resp3))
                .map_err(LockError::Connection)?,
        })
    }

    /// The node's host, for a redirect that names a port only (`MOVED 3999 :6381`: same host).
    pub(crate) fn host(&self) -> Option<String> {
        seed_host(self.client.get_connection_info())
    }

    /// Whether `other` is this node (the same address).
    pub(crate) fn same_address(&self, other: &Node) -> bool {
        self.client.get_connection_info().addr() == other.client.get_connection_info().addr()
    }
}

pub(crate) fn seed_host(info: &ConnectionInfo) -> Option<String> {
    match info.addr() {
        ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => Some(host.clone()),
        _ => None,
    }
}
