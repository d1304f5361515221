//! The README's install forms and quick start, as a user's project of its own would use them:
//! a project outside this repository that depends on the crate by a path relative to itself
//! (and, ignored by default, by the repository's git URL), with `redis = "1.8"` beside it, and
//! whose `main.rs` is the README's quick start (and its fenced-writes and Sentinel blocks, and
//! docs/sentinel.md's client example), word for word. The project starts from the workspace's
//! Cargo.lock and resolves and fetches the rest from the registry (crates.io), as a new user's
//! build does: nothing is `--offline`, so it passes with an empty cargo cache
//! (`CARGO_HOME=$(mktemp -d)`) too.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn workspace_root() -> PathBuf {
    crate_dir()
        .parent()
        .and_then(Path::parent)
        .expect("clients/rust sits in the workspace")
        .to_path_buf()
}

/// The README's first ```rust block after `heading`.
fn readme_block(heading: &str) -> String {
    let readme = std::fs::read_to_string(crate_dir().join("README.md")).expect("README.md");
    let section = readme
        .split_once(heading)
        .map(|(_, rest)| rest)
        .expect("the heading");
    let (_, code) = section.split_once("```rust\n").expect("a rust block");
    code.split_once("\n```").expect("its end").0.to_string()
}

/// docs/sentinel.md's Rust client example (statements that end with the hold released), inside
/// an async function of its own.
fn sentinel_guide_example() -> String {
    let page = std::fs::read_to_string(workspace_root().join("docs/sentinel.md"))
        .expect("docs/sentinel.md");
    let (_, code) = page.split_once("```rust\n").expect("a rust block");
    let code = code.split_once("\n```").expect("its end").0;
    format!(
        "pub async fn example() -> Result<(), redis_lock_client::LockError> {{\n{code}\nOk(())\n}}"
    )
}

/// The README's `[dependencies]` block.
fn readme_dependencies() -> String {
    let readme = std::fs::read_to_string(crate_dir().join("README.md")).expect("README.md");
    let (_, toml) = readme.split_once("```toml\n").expect("a toml block");
    toml.split_once("\n```").expect("its end").0.to_string()
}

/// A project of its own in a fresh temporary directory, next to a `redis-lock` link to this
/// repository (a checkout next to the project, as the README's path form has it).
struct Project {
    dir: PathBuf,
}

impl Project {
    fn new(name: &str, dependency: &str, main: &str) -> Project {
        let base = std::env::temp_dir().join(format!(
            "redis-lock-client-install-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("app/src")).unwrap();
        std::os::unix::fs::symlink(workspace_root(), base.join("redis-lock")).unwrap();
        let manifest = format!(
            "[package]\nname = \"app\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
             [dependencies]\n{dependency}\nredis = \"1.8\"\n\
             tokio = {{ version = \"1\", features = [\"macros\", \"rt-multi-thread\"] }}\n"
        );
        std::fs::write(base.join("app/Cargo.toml"), manifest).unwrap();
        std::fs::write(base.join("app/src/main.rs"), main).unwrap();
        // The workspace's lock file: what the project shares with the workspace (the library's
        // redis, tokio, ...) resolves to the versions the workspace tests, already fetched;
        // what it adds (the user's `redis = "1.8"` with its default features) is resolved and
        // fetched from the registry as a new user's build does.
        std::fs::copy(
            workspace_root().join("Cargo.lock"),
            base.join("app/Cargo.lock"),
        )
        .expect("copy the workspace's Cargo.lock");
        Project {
            dir: base.join("app"),
        }
    }

    fn cargo(&self, args: &[&str]) -> String {
        let out = Command::new(env!("CARGO"))
            .args(args)
            .current_dir(&self.dir)
            // The dependencies' builds are shared between runs, away from the workspace's own.
            .env(
                "CARGO_TARGET_DIR",
                workspace_root().join("target/install-check"),
            )
            .output()
            .expect("cargo");
        assert!(
            out.status.success(),
            "cargo {args:?}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The resolved packages, as `name version`.
    fn packages(&self) -> Vec<String> {
        let json = self.cargo(&["metadata", "--format-version", "1"]);
        // `"name":"x","version":"y"` pairs of the packages list, without a JSON parser.
        json.split("{\"name\":\"")
            .skip(1)
            .filter_map(|p| {
                let (name, rest) = p.split_once('"')?;
                let version = rest.split("\"version\":\"").nth(1)?.split('"').next()?;
                Some(format!("{name} {version}"))
            })
            .collect()
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        if let Some(base) = self.dir.parent() {
            let _ = std::fs::remove_dir_all(base);
        }
    }
}

/// The README's dependency line of the given form, uncommented.
fn readme_dependency(form: &str) -> String {
    readme_dependencies()
        .lines()
        .map(|l| l.trim_start_matches("# "))
        .find(|l| l.starts_with("redis-lock-client = ") && l.contains(form))
        .expect("the README names the form")
        .to_string()
}

#[test]
fn the_readme_blocks_build_in_a_project_that_takes_the_crate_by_a_relative_path() {
    let dependency = readme_dependency("path = ");
    assert!(
        dependency.contains("\"../"),
        "relative to the project: {dependency}"
    );
    // The quick start, and beside it the README's other complete blocks (they define functions),
    // and docs/sentinel.md's client example.
    let main = format!(
        "{}\n\n#[allow(dead_code)]\nmod fenced {{\n{}\n}}\n\n#[allow(dead_code)]\nmod sentinel {{\n{}\n}}\n\n#[allow(dead_code)]\nmod sentinel_guide {{\n{}\n}}\n",
        readme_block("## Quick start"),
        readme_block("## Fenced writes"),
        readme_block("## Sentinel and replicas"),
        sentinel_guide_example()
    );
    let project = Project::new("path", &dependency, &main);
    let packages = project.packages();
    let version = format!("redis-lock-client {}", env!("CARGO_PKG_VERSION"));
    assert!(packages.contains(&version), "{packages:?}");
    // The user's `redis = "1.8"` is the library's redis: one `redis::Client` type.
    let redis: Vec<&String> = packages
        .iter()
        .filter(|p| p.starts_with("redis 1."))
        .collect();
    assert_eq!(redis.len(), 1, "{packages:?}");
    project.cargo(&["check", "--quiet"]);
}

#[test]
#[ignore = "needs the network (crates.io's index): cargo test -p redis-lock-client --test install -- --ignored"]
fn the_readme_git_form_resolves_from_a_project_of_its_own() {
    // The README's form with this repository's own git URL and the commit checked out.
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(args)
            .current_dir(crate_dir())
            .output()
            .expect("git");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let repo = std::fs::canonicalize(crate_dir().join(git(&["rev-parse", "--git-common-dir"])))
        .expect("the repository");
    let head = git(&["rev-parse", "HEAD"]);
    let form = readme_dependency("git = ");
    let (before, _) = form.split_once("git = ").unwrap();
    let dependency = format!(
        "{before}git = \"file://{}\", rev = \"{head}\" }}",
        repo.display()
    );
    let project = Project::new("git", &dependency, "fn main() {}\n");
    let packages = project.packages();
    assert!(
        packages.iter().any(|p| p.starts_with("redis-lock-client ")),
        "{packages:?}"
    );
}
