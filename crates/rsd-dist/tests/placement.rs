//! Host names exchanged over the rendezvous store, two ranks over Gloo on 127.0.0.1. As in
//! gloo.rs, a test launches copies of this test binary, each running one `rank_*` function
//! (ignored in normal runs) as one rank with torchrun's variables set; here rank 1 may also get
//! `RSD_DIST_FAULT_HOST`, the test hook that makes it report another host name. Built only with
//! the `fault-injection` feature (`required-features` in Cargo.toml), the one that reads it.
use std::process::{Command, Stdio};
use std::time::Duration;

use rsd_dist::placement::FAULT_HOST_ENV;
use rsd_dist::testing::{free_port, ROLE_ENV};
use rsd_dist::{exchange_hosts, Mesh, MeshShape, Placement, Rendezvous};
use tch::Device;

/// How long the ranks have to start and meet: a hang guard for a loaded machine.
const TIMEOUT: Duration = Duration::from_secs(120);
/// What rank 1 calls its host when the test hook is on.
const OTHER: &str = "otherhost";
/// Set in the children: whether rank 1 was given [`OTHER`] (`1`) or not (`0`).
const MOVED_ENV: &str = "RSD_PLACEMENT_TEST_MOVED";

/// Runs the rank function `role` as two ranks, rank 1 with `RSD_DIST_FAULT_HOST=otherhost` when
/// `moved`, and panics with their output unless both pass. `rsd_dist::testing::launch_ranks`,
/// with one variable more for one rank.
fn launch(role: &str, moved: bool) {
    let world = 2;
    let port = free_port();
    let exe = std::env::current_exe().expect("the test binary's path");
    let children: Vec<_> = (0..world)
        .map(|rank| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                role,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE_ENV, role)
            .env(MOVED_ENV, if moved { "1" } else { "0" })
            .envs(Rendezvous::local(port, rank, world).to_env())
            // Whatever the test's own environment says, only rank 1 may pretend.
            .env_remove(FAULT_HOST_ENV)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            if moved && rank == 1 {
                cmd.env(FAULT_HOST_ENV, OTHER);
            }
            cmd.spawn().expect("starting a rank")
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
        if !out.status.success() || !text.contains("1 passed") {
            failed.push(text);
        }
    }
    assert!(failed.is_empty(), "{role} failed:\n{}", failed.join("\n"));
}

#[test]
fn a_rank_on_another_host_puts_the_cp_group_across_hosts() {
    launch("rank_hosts", true);
}

#[test]
fn ranks_on_one_host_keep_the_cp_group_on_it() {
    launch("rank_hosts", false);
}

/// One rank of both tests: the mesh's exchange and the free function's agree, on every rank, with
/// what the launcher set; the placement reports the group across hosts exactly when rank 1 moved.
#[test]
#[ignore = "one rank of the placement tests"]
fn rank_hosts() {
    if std::env::var(ROLE_ENV).ok().as_deref() != Some("rank_hosts") {
        return;
    }
    let moved = std::env::var(MOVED_ENV).unwrap() == "1";
    let machine = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let machine = machine.trim();
    let want: Vec<String> = if moved {
        vec![machine.into(), OTHER.into()]
    } else {
        vec![machine.into(), machine.into()]
    };

    let rdzv = Rendezvous::from_env().unwrap();
    let mesh = Mesh::new(&rdzv, MeshShape { dp: 0, cp: 2 }, Device::Cpu, TIMEOUT).unwrap();
    assert_eq!(mesh.hosts().unwrap(), want, "Mesh::hosts");
    // A store client of its own, as the failure watch connects; the same keys, the same answer.
    assert_eq!(
        exchange_hosts(mesh.rendezvous().unwrap(), TIMEOUT).unwrap(),
        want,
        "exchange_hosts"
    );

    let placement = mesh.placement().unwrap();
    assert_eq!(placement.hosts(), want.as_slice());
    if moved {
        assert_eq!(placement.node_count(), 2);
        assert_eq!(placement.cp_groups_across_hosts(), vec![vec![0, 1]]);
        assert_eq!(
            placement.layout_line(),
            format!("2 nodes × 1 rank ({machine}: rank 0; {OTHER}: rank 1)")
        );
        let err = placement.cp_across_hosts_message(false).unwrap();
        assert!(
            err.contains(&format!("ranks 0-1 on {machine} (0), {OTHER} (1)"))
                && err.contains("cp_across_nodes = true"),
            "{err}"
        );
    } else {
        assert_eq!(placement.node_count(), 1);
        assert!(placement.cp_groups_across_hosts().is_empty());
        assert_eq!(placement.cp_across_hosts_message(false), None);
        assert_eq!(
            placement.layout_line(),
            format!("1 node × 2 ranks ({machine}: ranks 0-1)")
        );
    }
    // The same hosts split as dp 2 × cp 1: no context-parallel group to span anything.
    let dp_only = Placement::new(want, MeshShape { dp: 2, cp: 1 }).unwrap();
    assert!(dp_only.cp_groups_across_hosts().is_empty());
    mesh.world().unwrap().barrier().unwrap();
}
