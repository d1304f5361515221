//! The machine the numbers come from, and the one limit the bench has to raise.

use std::path::Path;
use std::process::Command;

/// Raises RLIMIT_NOFILE (soft and hard) to at least `wanted`, as far as the kernel allows.
/// Raising the hard limit needs root (CAP_SYS_RESOURCE); without it the soft limit goes up to
/// the hard one and the waiter scenarios use as many connections as that allows.
pub fn raise_open_files_limit(wanted: u64) -> u64 {
    let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(wanted);
    let target: libc::rlim_t = wanted.min(nr_open);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read or write the struct we pass, which lives on the
    // stack for the duration of the call.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        if limit.rlim_cur >= target {
            return limit.rlim_cur;
        }
        let raised = libc::rlimit {
            rlim_cur: target,
            rlim_max: target.max(limit.rlim_max),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
            let soft_only = libc::rlimit {
                rlim_cur: limit.rlim_max.min(target),
                rlim_max: limit.rlim_max,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &soft_only);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    limit.rlim_cur
}

/// The current soft RLIMIT_NOFILE.
pub fn open_files_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: as above, a stack struct written by the call.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    limit.rlim_cur
}

pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub os: String,
    pub kernel: String,
    pub load_average: String,
    pub redis_server: String,
    pub module_commit: String,
    pub module_size: u64,
    pub rustc: String,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn output(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string())
}

impl Machine {
    pub fn describe(module: &Path) -> Machine {
        let cpuinfo = read("/proc/cpuinfo");
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
            .unwrap_or_else(|| "unknown".to_string());
        let memory_kib: f64 = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|l| l.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0.0);
        let os = read("/etc/os-release")
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|l| l.trim_matches('"').to_string())
            .unwrap_or_else(|| "unknown".to_string());
        let root = crate::workspace_root();
        let root = root.to_string_lossy();
        let commit = output("git", &["-C", &root, "rev-parse", "--short", "HEAD"]);
        let dirty = !output(
            "git",
            &["-C", &root, "status", "--porcelain", "--", "src", "core"],
        )
        .is_empty();
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_gib: memory_kib / 1024.0 / 1024.0,
            os,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            load_average: read("/proc/loadavg")
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
            redis_server: output(lock_testkit::server_bin(), &["--version"]),
            module_commit: if dirty {
                format!("{commit} + uncommitted changes in src/ or core/")
            } else {
                commit
            },
            module_size: std::fs::metadata(module).map_or(0, |m| m.len()),
            rustc: output("rustc", &["--version"]),
        }
    }
}
