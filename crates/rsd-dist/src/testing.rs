//! Multi-process tests over Gloo on 127.0.0.1, for this workspace's test binaries: a test
//! launches N copies of its own binary, each running one `#[ignore]`d rank function as one rank
//! with torchrun's variables set, and fails with every rank's output unless all pass. These
//! helpers panic on failure, as test code does; nothing outside tests calls them.
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{Backend, ProcessGroup, Rendezvous};

/// Set in a child: which rank function it runs.
pub const ROLE_ENV: &str = "RSD_DIST_TEST_ROLE";
/// What a rank prints when it leaves on purpose, mid-test: it counts as passed.
pub const LEFT: &str = "[rank left on purpose]";

/// A port on 127.0.0.1 nobody listens on now.
pub fn free_port() -> u16 {
    crate::launch::free_local_port().expect("a free port on 127.0.0.1")
}

/// Runs the test function `role` of the current test binary as `world` ranks (child processes)
/// and panics with their output unless all succeed.
pub fn launch_ranks(role: &str, world: usize) {
    let port = free_port();
    let exe = std::env::current_exe().expect("the test binary's path");
    let children: Vec<_> = (0..world)
        .map(|rank| {
            Command::new(&exe)
                .args([
                    role,
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(ROLE_ENV, role)
                .envs(Rendezvous::local(port, rank, world).to_env())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("starting a rank")
        })
        .collect();
    let mut failed = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("waiting for a rank");
        let text = format!(
            "--- rank {rank}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The harness prints "1 passed" only when the rank function returned.
        if !out.status.success() || !(text.contains("1 passed") || text.contains(LEFT)) {
            failed.push(text);
        }
    }
    assert!(failed.is_empty(), "{role} failed:\n{}", failed.join("\n"));
}

/// The world of a rank [`launch_ranks`] started for `role`, or `None` when the test runs any
/// other way (then the rank function returns at once).
pub fn rank_world(role: &str, timeout: Duration) -> Option<ProcessGroup> {
    if std::env::var(ROLE_ENV).ok()?.as_str() != role {
        return None;
    }
    Some(ProcessGroup::from_env(Backend::Gloo, timeout).expect("rendezvous"))
}
