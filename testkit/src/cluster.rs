//! A Redis Cluster of masters on loopback, created the way a user does it.

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use redis::Value;

use crate::eventually;
use crate::server::{cli_bin, Options, Server};

/// A Redis Cluster of masters on loopback, each with the module loaded, created the way a user
/// does it (`redis-server --cluster-enabled yes`, then `redis-cli --cluster create`; `$LOCK_SERVER`
/// and `$LOCK_CLI` when set).
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start(masters: usize) -> Cluster {
        Cluster::start_nodes(masters, &node_options())
    }

    /// A cluster of plain servers, without the module (as a managed service runs one).
    pub fn start_without_module(masters: usize) -> Cluster {
        Cluster::start_nodes(
            masters,
            &Options {
                without_module: true,
                ..node_options()
            },
        )
    }

    fn start_nodes(masters: usize, options: &Options) -> Cluster {
        let nodes: Vec<Server> = (0..masters)
            .map(|_| Server::start_on_free(cluster_port(), options))
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new(cli_bin())
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .arg("--cluster-yes")
            .output()
            .expect("redis-cli --cluster create ($LOCK_CLI)");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster { nodes };
        for node in &cluster.nodes {
            let mut con = node.connect();
            assert!(
                eventually(Duration::from_secs(20), || {
                    let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut con).unwrap();
                    info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
                }),
                "the cluster did not come up"
            );
        }
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    pub fn client(&self) -> redis::cluster::ClusterConnection {
        redis::cluster::ClusterClient::new(self.urls())
            .expect("cluster client")
            .get_connection()
            .expect("cluster connection")
    }

    /// The node that serves `slot` now.
    pub fn node_for_slot(&self, slot: u16) -> &Server {
        let mut con = self.nodes[0].connect();
        let shards: Vec<(i64, i64, Vec<Value>)> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query::<Vec<Vec<Value>>>(&mut con)
            .expect("CLUSTER SLOTS")
            .into_iter()
            .map(|mut entry| {
                let low = redis::from_redis_value(&entry[0]).unwrap();
                let high = redis::from_redis_value(&entry[1]).unwrap();
                (low, high, entry.drain(2..).collect())
            })
            .collect();
        let (_, _, owners) = shards
            .iter()
            .find(|(low, high, _)| (*low..=*high).contains(&i64::from(slot)))
            .expect("slot served");
        let master: (String, i64) = match &owners[0] {
            Value::Bulk(fields) => (
                redis::from_redis_value(&fields[0]).unwrap(),
                redis::from_redis_value(&fields[1]).unwrap(),
            ),
            other => panic!("unexpected CLUSTER SLOTS entry {other:?}"),
        };
        self.nodes
            .iter()
            .find(|n| i64::from(n.port) == master.1)
            .expect("a node of this cluster")
    }

    /// A new node, with the module, added as a replica of `master` (`redis-cli --cluster
    /// add-node --cluster-slave`), returned once it is in sync and `master` counts it in `WAIT`
    /// ([`Server::wait_replicas_acknowledge`]). (Review helper.)
    pub fn add_replica(&self, master: &Server) -> Server {
        let replica = Server::start_on_free(cluster_port(), &node_options());
        let out = Command::new(cli_bin())
            .arg("--cluster")
            .arg("add-node")
            .arg(format!("127.0.0.1:{}", replica.port))
            .arg(format!("127.0.0.1:{}", master.port))
            .arg("--cluster-slave")
            .arg("--cluster-master-id")
            .arg(Cluster::node_id(master))
            .output()
            .expect("redis-cli --cluster add-node");
        assert!(
            out.status.success(),
            "add-node failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let mut con = replica.connect();
        assert!(
            eventually(Duration::from_secs(30), || {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut con)
                    .unwrap();
                info.contains("master_link_status:up")
            }),
            "the replica did not sync"
        );
        master.wait_replicas_acknowledge(master.connected_replicas());
        replica
    }

    pub fn node_id(node: &Server) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut node.connect())
            .expect("CLUSTER MYID")
    }

    /// Whether every node knows the same config epoch for each master, and no two masters
    /// share one (`CLUSTER NODES`). Only then does a node that takes a slot (`SETSLOT NODE` to
    /// itself, `BUMPEPOCH`) get an epoch no other has: one that bumped to an epoch it did not
    /// know another master had lost the slot to that master's `UPDATE` (the server matrix,
    /// Valkey 9.1: the target of a move answered `MOVED` to the source).
    pub fn epochs_agreed(&self) -> bool {
        let views: Vec<Vec<(String, String)>> = self
            .nodes
            .iter()
            .map(|node| {
                let text: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query(&mut node.connect())
                    .unwrap_or_default();
                let mut view: Vec<(String, String)> = text
                    .lines()
                    .filter_map(|line| {
                        let fields: Vec<&str> = line.split_whitespace().collect();
                        let (id, flags, epoch) = (fields.first()?, fields.get(2)?, fields.get(6)?);
                        let master = flags.split(',').any(|flag| flag == "master");
                        master.then(|| (id.to_string(), epoch.to_string()))
                    })
                    .collect();
                view.sort();
                view
            })
            .collect();
        let Some(first) = views.first() else {
            return false;
        };
        let mut epochs: Vec<&String> = first.iter().map(|(_, epoch)| epoch).collect();
        epochs.sort();
        epochs.dedup();
        !first.is_empty() && epochs.len() == first.len() && views.iter().all(|v| v == first)
    }

    /// Whether every node names the node `id` as the master of `slot` (`CLUSTER NODES`).
    pub fn all_name_owner(&self, slot: u16, id: &str) -> bool {
        self.nodes.iter().all(|node| {
            let text: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut node.connect())
                .unwrap_or_default();
            text.lines().any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.first() == Some(&id)
                    && fields.iter().skip(8).any(|range| {
                        let mut ends = range.splitn(2, '-').map(str::parse::<u16>);
                        match (ends.next(), ends.next()) {
                            (Some(Ok(low)), Some(Ok(high))) => (low..=high).contains(&slot),
                            (Some(Ok(one)), None) => one == slot,
                            _ => false,
                        }
                    })
            })
        })
    }
}

/// A free port whose cluster bus port (port + 10000) is free too. Both are taken below Linux's
/// ephemeral range (32768+), so no client connection of a concurrent test can grab the bus
/// port between this check and the server's bind.
fn cluster_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Spread the start per process; then walk, so two tests in one process never pick the same.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = 20_000 + (std::process::id() % 2_000) as u16;
    loop {
        let port = 20_000 + (start - 20_000 + NEXT.fetch_add(1, Ordering::Relaxed)) % 2_700;
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            return port;
        }
    }
}

/// How every node of a [`Cluster`] is started: cluster mode, its own nodes.conf (each server
/// runs in a directory of its own), and a node timeout that lets a failover test finish soon.
fn node_options() -> Options {
    Options {
        extra: [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "5000",
        ]
        .map(String::from)
        .to_vec(),
        ..Options::default()
    }
}
