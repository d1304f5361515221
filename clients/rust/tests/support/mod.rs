//! One real `redis-server` with the module loaded, per test, on a free loopback port; killed and
//! reaped on drop. (To be replaced by the project's shared test kit.)
//!
//! `$LOCK_MODULE` names the module; unset, the workspace's module is built once per test binary
//! (`cargo build --lib -p redis-lock`) and loaded from `$CARGO_TARGET_DIR` (or `target/`).
//! `$LOCK_SERVER` names the server binary (default `redis-server`).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

static BUILD: Once = Once::new();

fn module_path() -> PathBuf {
    if let Some(path) = std::env::var_os("LOCK_MODULE").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    BUILD.call_once(|| {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--lib", "--quiet", "-p", "redis-lock"])
            .current_dir(&root)
            .status()
            .expect("run cargo build for the module");
        assert!(status.success(), "building the module failed");
    });
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    target.join("debug/libredis_lock.so")
}

pub struct Server {
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Server {
    pub fn start() -> Server {
        let module = module_path();
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("free port");
            let dir = tempfile::tempdir().expect("tempdir");
            let child = Command::new(
                std::env::var_os("LOCK_SERVER")
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "redis-server".into()),
            )
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--loadmodule")
            .arg(&module)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server (set LOCK_SERVER)");
            let mut server = Server {
                port,
                child,
                _dir: dir,
            };
            if server.wait_for_ping() {
                return server;
            }
            // Its port was taken between the probe and the bind, or it failed: try another.
        }
        panic!("redis-server with the module did not start (module {module:?})");
    }

    /// True once *this* child answers PING; false if it exited or 10 s passed.
    fn wait_for_ping(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return false;
            }
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                let mut buf = [0u8; 7];
                if s.write_all(b"PING\r\n").is_ok()
                    && s.read_exact(&mut buf).is_ok()
                    && &buf == b"+PONG\r\n"
                {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
