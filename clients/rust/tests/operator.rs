//! What an operator sees of the library on the server: every connection it opens to a node is
//! named after its client (`CLIENT SETNAME redis-lock-client:<client id>`) and names the library
//! (`CLIENT SETINFO LIB-NAME`, where the server has it), so that `CLIENT LIST` tells which
//! connection holds an `EPHEMERAL` hold and whose it is.

mod support;

use redis::Value;
use redis_lock_client::blocking;
use support::{setup, Server};

/// `CLIENT LIST` (or `CLIENT LIST ID id`) as one line per connection.
async fn client_list(raw: &mut redis::aio::MultiplexedConnection, id: Option<i64>) -> Vec<String> {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("LIST");
    if let Some(id) = id {
        cmd.arg("ID").arg(id);
    }
    let list: String = cmd.query_async(raw).await.unwrap();
    list.lines().map(str::to_string).collect()
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|f| f.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_list_shows_whose_connection_holds_an_ephemeral_hold() {
    let (_server, client, mut raw) = setup().await;
    let guard = client.lock("jobs").ephemeral().acquire().await.unwrap();
    // LOCK.INFO names the connection the hold is bound to ...
    let info: Value = redis::cmd("LOCK.INFO")
        .arg("jobs")
        .query_async(&mut raw)
        .await
        .unwrap();
    let Value::Array(fields) = info else {
        panic!("held: {info:?}")
    };
    let id = fields
        .chunks(2)
        .find_map(|p| match p {
            [Value::BulkString(n), Value::Int(id)] if n == b"ephemeral" => Some(*id),
            _ => None,
        })
        .expect("bound to a connection");
    // ... and CLIENT LIST ID shows whose it is: the client's id, also the prefix of the
    // hold's owner.
    let line = client_list(&mut raw, Some(id)).await;
    let [line] = line.as_slice() else {
        panic!("{line:?}")
    };
    let name = format!("redis-lock-client:{}", client.id());
    assert_eq!(field(line, "name"), Some(name.as_str()), "{line}");
    assert!(guard.owner().starts_with(client.id()));
    if support::reports_key_events() {
        // CLIENT SETINFO: Redis >= 7.2 and Valkey.
        assert_eq!(field(line, "lib-name"), Some("redis-lock-client"), "{line}");
        assert_eq!(
            field(line, "lib-ver"),
            Some(env!("CARGO_PKG_VERSION")),
            "{line}"
        );
    }
    // Every connection the client opened carries the name: the shared one, the lost-hold
    // signal's, the EPHEMERAL hold's, a waiting acquire's while it waits.
    let mut holder = client.lock("busy").acquire().await.unwrap();
    let waiter = {
        let lock = client.lock("busy");
        tokio::spawn(async move { lock.acquire().await.map(|_| ()) })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let named = client_list(&mut raw, None)
            .await
            .iter()
            .filter(|l| field(l, "name") == Some(name.as_str()))
            .count();
        if named >= 4 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{named} named connections"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    holder.release().await.unwrap();
    waiter.await.unwrap().unwrap();
}

#[test]
fn the_blocking_client_names_its_connections_too() {
    let server = Server::start();
    let client = blocking::LockClient::open(&server.url()).unwrap();
    let _guard = client.lock("k").ephemeral().acquire().unwrap();
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut con).unwrap();
    let name = format!("name=redis-lock-client:{}", client.id());
    assert!(
        list.lines().filter(|l| l.contains(&name)).count() >= 2,
        "{list}"
    );
}
