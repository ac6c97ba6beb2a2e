//! Where the ranks run: every rank's host name, shared over the rendezvous store, and what that
//! means for the mesh's layout.
//!
//! Context-parallel groups are consecutive world ranks ([`layout`]), on the assumption that
//! consecutive ranks share a node: the per-layer K/V all-gathers of context parallelism then run
//! over the node's own links. A launcher that deals ranks out round-robin (SLURM's
//! `--distribution=cyclic`), or one whose ranks per node are not a multiple of the
//! context-parallel degree, puts a group's ranks on several hosts, and every layer's gathers
//! silently cross the network. [`Placement`] finds such groups and says what to change; the
//! trainer decides whether that is an error or a warning.
//!
//! Test hook (builds with the `fault-injection` feature only): `RSD_DIST_FAULT_HOST=NAME` makes
//! [`this_host`] return `NAME` instead of the machine's host name, so that a test on one machine
//! can pretend that a rank runs elsewhere. Production builds do not read the variable.
use std::collections::HashMap;
use std::time::Duration;

use crate::env::Rendezvous;
use crate::error::{DistError, Result};
use crate::mesh::{layout, Mesh, MeshShape};
use crate::store::Store;

/// The variable that overrides [`this_host`] in builds with the `fault-injection` feature.
pub const FAULT_HOST_ENV: &str = "RSD_DIST_FAULT_HOST";

/// Where rank R's host name is kept in the store (`rsd/host/R`).
const KEY: &str = "rsd/host/";

/// Groups and hosts named in full in a message before the rest is cut to "…".
const SHOWN: usize = 3;

fn host_key(rank: usize) -> String {
    format!("{KEY}{rank}")
}

/// This machine's host name (`gethostname`). In builds with the `fault-injection` feature, a
/// non-empty `RSD_DIST_FAULT_HOST` replaces it (module documentation).
pub fn this_host() -> String {
    #[cfg(feature = "fault-injection")]
    if let Some(host) = std::env::var(FAULT_HOST_ENV).ok().filter(|h| !h.is_empty()) {
        return host;
    }
    machine_host()
}

/// The kernel's host name. Never fails in practice (the buffer is far above Linux's 64-byte
/// limit); should it, the error stands in for the name, so that the layout line shows it rather
/// than two nodes that failed alike passing for one.
fn machine_host() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for writes of its whole length for the duration of the call.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return format!("<gethostname failed: {}>", std::io::Error::last_os_error());
    }
    // POSIX does not promise a terminating NUL when the name is truncated: stop at the first NUL
    // or at the buffer's end.
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Every rank's host name, index = world rank: each rank sets its own in the store, then waits
/// up to `timeout` for every other rank's. Every rank of the world must call it (as a
/// collective). Connects a store client of its own, as [`FailureWatch`] does, so it must run
/// after the world group exists (rank 0's group hosts the store, unless torchrun's agent does);
/// [`Mesh::hosts`] uses the world group's store instead.
///
/// [`FailureWatch`]: crate::FailureWatch
pub fn exchange_hosts(rdzv: &Rendezvous, timeout: Duration) -> Result<Vec<String>> {
    if rdzv.world_size == 1 {
        return Ok(vec![this_host()]);
    }
    let store = Store::tcp(
        &rdzv.master_addr,
        rdzv.master_port,
        false,
        rdzv.world_size,
        rdzv.rank,
        timeout,
    )
    .map_err(|message| DistError::Store {
        op: "connect",
        key: format!("{}:{}", rdzv.master_addr, rdzv.master_port),
        rank: rdzv.rank,
        message,
    })?;
    // torchrun's agent store outlives restarts: each attempt's keys are kept apart under the
    // prefix the world group uses too.
    let store = match rdzv.agent_store {
        Some(attempt) => store.prefixed(&format!("/worker/attempt_{attempt}/"))?,
        None => store,
    };
    exchange(&store, rdzv.rank, rdzv.world_size, timeout)
}

/// Sets this rank's host name in `store` and reads all `world` of them.
fn exchange(store: &Store, rank: usize, world: usize, timeout: Duration) -> Result<Vec<String>> {
    store.set(&host_key(rank), this_host().as_bytes())?;
    (0..world)
        .map(|r| {
            store
                .get(&host_key(r), timeout)
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        })
        .collect()
}

impl Mesh {
    /// Every rank's host name, index = world rank, over the world group's store (the group's
    /// timeout bounds the wait). Every rank must call it. One process: `[this_host()]`.
    pub fn hosts(&self) -> Result<Vec<String>> {
        match self.world() {
            None => Ok(vec![this_host()]),
            Some(world) => exchange(
                world.store(),
                self.rank(),
                self.world_size(),
                world.timeout(),
            ),
        }
    }

    /// This mesh's [`Placement`]: [`Mesh::hosts`] (every rank must call it) with the mesh's
    /// degrees.
    pub fn placement(&self) -> Result<Placement> {
        Placement::new(
            self.hosts()?,
            MeshShape {
                dp: self.dp_size(),
                cp: self.cp_size(),
            },
        )
    }
}

/// One host and the world ranks on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The host name.
    pub host: String,
    /// Its world ranks, ascending.
    pub ranks: Vec<usize>,
}

/// Which host every rank runs on, against the mesh's data-parallel × context-parallel layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Index = world rank.
    hosts: Vec<String>,
    dp: usize,
    cp: usize,
    /// In the order of their first rank.
    nodes: Vec<Node>,
}

impl Placement {
    /// The placement of `hosts` (index = world rank, as [`exchange_hosts`] returns them) split as
    /// `shape` asks ([`layout`]'s errors when it cannot be).
    pub fn new(hosts: Vec<String>, shape: MeshShape) -> Result<Placement> {
        let (dp, cp) = layout(hosts.len(), shape)?;
        let mut nodes: Vec<Node> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (rank, host) in hosts.iter().enumerate() {
            let i = *index.entry(host.as_str()).or_insert_with(|| {
                nodes.push(Node {
                    host: host.clone(),
                    ranks: Vec::new(),
                });
                nodes.len() - 1
            });
            nodes[i].ranks.push(rank);
        }
        Ok(Placement {
            hosts,
            dp,
            cp,
            nodes,
        })
    }

    /// Every rank's host, index = world rank.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The hosts and their ranks, in the order of their first rank.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The number of distinct hosts.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Data-parallel ranks.
    pub fn dp_size(&self) -> usize {
        self.dp
    }

    /// Context-parallel ranks per group.
    pub fn cp_size(&self) -> usize {
        self.cp
    }

    /// For the start-up log: `2 nodes × 4 ranks (gpu01: ranks 0-3; gpu02: ranks 4-7)`; a few
    /// hosts are named, the rest counted.
    pub fn layout_line(&self) -> String {
        let n = self.nodes.len();
        let counts: Vec<usize> = self.nodes.iter().map(|node| node.ranks.len()).collect();
        let (min, max) = (
            counts.iter().copied().min().unwrap_or(0),
            counts.iter().copied().max().unwrap_or(0),
        );
        let head = if min == max {
            format!("{} × {}", plural(n, "node"), plural(min, "rank"))
        } else {
            format!(
                "{} × {min}-{max} ranks, {} in all",
                plural(n, "node"),
                self.hosts.len()
            )
        };
        let mut shown: Vec<String> = self
            .nodes
            .iter()
            .take(SHOWN)
            .map(|node| {
                let word = if node.ranks.len() == 1 {
                    "rank"
                } else {
                    "ranks"
                };
                format!("{}: {word} {}", node.host, ranks_text(&node.ranks))
            })
            .collect();
        if n > SHOWN {
            let more = n - SHOWN;
            shown.push(format!(
                "… {more} more {}",
                if more == 1 { "node" } else { "nodes" }
            ));
        }
        // Hosts apart by semicolons: a host's ranks may be a list with commas (cyclic layouts).
        format!("{head} ({})", shown.join("; "))
    }

    /// The context-parallel groups whose ranks are on more than one host, each as its world
    /// ranks (group `d` is ranks `d·cp .. (d+1)·cp`). Never any when `cp == 1`.
    pub fn cp_groups_across_hosts(&self) -> Vec<Vec<usize>> {
        (0..self.dp)
            .map(|d| (d * self.cp..(d + 1) * self.cp).collect::<Vec<usize>>())
            .filter(|group| group.iter().any(|&r| self.hosts[r] != self.hosts[group[0]]))
            .collect()
    }

    /// What to tell the user when context-parallel groups span hosts (`None` when none does),
    /// naming the first few groups' ranks and hosts. With `allowed` false (the trainer refuses to
    /// start) it says how to launch instead, or to set `cp_across_nodes = true`; with `allowed`
    /// true (the config said so) it is a warning that the gathers cross the network.
    pub fn cp_across_hosts_message(&self, allowed: bool) -> Option<String> {
        let groups = self.cp_groups_across_hosts();
        if groups.is_empty() {
            return None;
        }
        let mut named: Vec<String> = groups
            .iter()
            .take(SHOWN)
            .map(|g| self.group_text(g))
            .collect();
        if groups.len() > SHOWN {
            named.push(format!("… {} more", groups.len() - SHOWN));
        }
        let what = format!(
            "{} of {} context-parallel groups (--cp {}) have ranks on more than one host: {}",
            groups.len(),
            self.dp,
            self.cp,
            named.join("; ")
        );
        Some(if allowed {
            format!(
                "context parallelism across hosts, allowed by `cp_across_nodes = true`: {what}. \
                 Every layer's K/V all-gather of these groups crosses the network, which is far \
                 slower than a node's own links."
            )
        } else {
            format!(
                "context parallelism across hosts: {what}, so every layer's K/V all-gather would \
                 cross the network. Consecutive ranks must share a node: launch with block \
                 distribution (`srun --distribution=block`, SLURM's default; not `cyclic`) or \
                 torchrun's one agent per node, with a number of ranks per node that is a \
                 multiple of {}; or set `cp_across_nodes = true` in the config to allow it.",
                self.cp
            )
        })
    }

    /// `ranks 0-3 on gpu01 (0, 2), gpu02 (1, 3)`.
    fn group_text(&self, group: &[usize]) -> String {
        let mut on: Vec<(&str, Vec<usize>)> = Vec::new();
        for &r in group {
            let host = self.hosts[r].as_str();
            match on.iter_mut().find(|(h, _)| *h == host) {
                Some((_, ranks)) => ranks.push(r),
                None => on.push((host, vec![r])),
            }
        }
        let mut hosts: Vec<String> = on
            .iter()
            .take(SHOWN)
            .map(|(h, ranks)| format!("{h} ({})", ranks_text(ranks)))
            .collect();
        if on.len() > SHOWN {
            hosts.push(format!("… {} more hosts", on.len() - SHOWN));
        }
        format!("ranks {} on {}", ranks_text(group), hosts.join(", "))
    }
}

/// `3 nodes`, `1 rank`.
fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// Ascending ranks as runs, `0-3, 8-11`; past four runs the first three, `…`, and the last
/// (`0, 2, 4, …, 998`), so a thousand ranks stay one short line.
fn ranks_text(ranks: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &r in ranks {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == r => *end = r,
            _ => runs.push((r, r)),
        }
    }
    let run = |&(a, b): &(usize, usize)| {
        if a == b {
            a.to_string()
        } else {
            format!("{a}-{b}")
        }
    };
    if runs.len() <= 4 {
        return runs.iter().map(run).collect::<Vec<_>>().join(", ");
    }
    let mut parts: Vec<String> = runs[..3].iter().map(run).collect();
    parts.push("…".into());
    parts.extend(runs.last().map(run));
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(dp: usize, cp: usize) -> MeshShape {
        MeshShape { dp, cp }
    }

    /// `nodes` hosts with `per` consecutive ranks each (SLURM's block distribution, torchrun).
    fn block(nodes: usize, per: usize) -> Vec<String> {
        (0..nodes * per)
            .map(|r| format!("gpu{:02}", r / per + 1))
            .collect()
    }

    /// `world` ranks dealt round-robin over `nodes` hosts (SLURM's cyclic distribution).
    fn cyclic(nodes: usize, world: usize) -> Vec<String> {
        (0..world)
            .map(|r| format!("gpu{:02}", r % nodes + 1))
            .collect()
    }

    #[test]
    fn a_block_layout_keeps_every_cp_group_on_one_host() {
        for (dp, cp) in [(2, 4), (4, 2), (8, 1), (0, 4)] {
            let p = Placement::new(block(2, 4), shape(dp, cp)).unwrap();
            assert_eq!(p.node_count(), 2);
            assert!(p.cp_groups_across_hosts().is_empty(), "dp {dp} × cp {cp}");
            assert_eq!(p.cp_across_hosts_message(false), None);
            assert_eq!(
                p.layout_line(),
                "2 nodes × 4 ranks (gpu01: ranks 0-3; gpu02: ranks 4-7)"
            );
        }
    }

    #[test]
    fn a_cyclic_layout_puts_every_cp_group_across_hosts() {
        let p = Placement::new(cyclic(2, 8), shape(0, 2)).unwrap();
        assert_eq!((p.dp_size(), p.cp_size()), (4, 2));
        assert_eq!(
            p.cp_groups_across_hosts(),
            vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
        );
        assert_eq!(
            p.layout_line(),
            "2 nodes × 4 ranks (gpu01: ranks 0, 2, 4, 6; gpu02: ranks 1, 3, 5, 7)"
        );
        let err = p.cp_across_hosts_message(false).unwrap();
        for want in [
            "4 of 4 context-parallel groups (--cp 2)",
            "ranks 0-1 on gpu01 (0), gpu02 (1)",
            "ranks 4-5 on gpu01 (4), gpu02 (5)",
            "… 1 more",
            "srun --distribution=block",
            "cp_across_nodes = true",
        ] {
            assert!(err.contains(want), "{want:?} not in {err}");
        }
        assert!(!err.contains("ranks 6-7"), "only the first groups: {err}");
        let warning = p.cp_across_hosts_message(true).unwrap();
        assert!(
            warning.contains("allowed by `cp_across_nodes = true`")
                && warning.contains("crosses the network")
                && !warning.contains("srun"),
            "{warning}"
        );
    }

    #[test]
    fn cp_1_never_spans_hosts() {
        for hosts in [cyclic(2, 8), cyclic(8, 8), block(3, 2)] {
            let n = hosts.len();
            let p = Placement::new(hosts, shape(0, 1)).unwrap();
            assert_eq!(p.dp_size(), n);
            assert!(p.cp_groups_across_hosts().is_empty());
            assert_eq!(p.cp_across_hosts_message(false), None);
        }
    }

    #[test]
    fn only_the_groups_that_straddle_a_node_boundary_offend() {
        // 3 ranks per node, cp 2: group 1 (ranks 2, 3) and group 4 (8, 9) straddle.
        let p = Placement::new(block(4, 3), shape(6, 2)).unwrap();
        assert_eq!(p.cp_groups_across_hosts(), vec![vec![2, 3], vec![8, 9]]);
        let err = p.cp_across_hosts_message(false).unwrap();
        assert!(
            err.contains("2 of 6 context-parallel groups")
                && err.contains("ranks 2-3 on gpu01 (2), gpu02 (3)")
                && err.contains("ranks 8-9 on gpu03 (8), gpu04 (9)")
                && err.contains("a multiple of 2"),
            "{err}"
        );
        // cp 4 over 2 nodes × 4, cyclic: a group's four ranks on two hosts, two each.
        let p = Placement::new(cyclic(2, 8), shape(2, 4)).unwrap();
        let err = p.cp_across_hosts_message(false).unwrap();
        assert!(
            err.contains("ranks 0-3 on gpu01 (0, 2), gpu02 (1, 3)"),
            "{err}"
        );
    }

    #[test]
    fn a_thousand_ranks_stay_one_short_line() {
        let p = Placement::new(block(125, 8), shape(0, 8)).unwrap();
        assert_eq!(
            p.layout_line(),
            "125 nodes × 8 ranks (gpu01: ranks 0-7; gpu02: ranks 8-15; gpu03: ranks 16-23; \
             … 122 more nodes)"
        );
        assert!(p.cp_groups_across_hosts().is_empty());
        let p = Placement::new(cyclic(2, 1000), shape(0, 8)).unwrap();
        assert_eq!(
            p.layout_line(),
            "2 nodes × 500 ranks (gpu01: ranks 0, 2, 4, …, 998; gpu02: ranks 1, 3, 5, …, 999)"
        );
        let err = p.cp_across_hosts_message(false).unwrap();
        assert!(err.len() < 800, "{} bytes: {err}", err.len());
        assert!(
            err.contains("125 of 125") && err.contains("… 122 more"),
            "{err}"
        );
        // Eight hosts in one group of eight: three named, the rest counted.
        let p = Placement::new(cyclic(8, 64), shape(0, 8)).unwrap();
        let err = p.cp_across_hosts_message(false).unwrap();
        assert!(
            err.contains("ranks 0-7 on gpu01 (0), gpu02 (1), gpu03 (2), … 5 more hosts"),
            "{err}"
        );
    }

    #[test]
    fn uneven_nodes_and_single_ranks_read_right() {
        let hosts: Vec<String> = ["a", "a", "a", "b"].map(String::from).to_vec();
        let p = Placement::new(hosts, shape(0, 1)).unwrap();
        assert_eq!(
            p.layout_line(),
            "2 nodes × 1-3 ranks, 4 in all (a: ranks 0-2; b: rank 3)"
        );
        let p = Placement::new(vec!["solo".into()], MeshShape::SINGLE).unwrap();
        assert_eq!(p.layout_line(), "1 node × 1 rank (solo: rank 0)");
        assert_eq!(p.nodes()[0].ranks, vec![0]);
    }

    #[test]
    fn a_host_list_that_does_not_fit_the_shape_is_a_layout_error() {
        let err = Placement::new(block(1, 3), shape(0, 2)).unwrap_err();
        assert!(matches!(err, DistError::Layout { .. }), "{err}");
    }

    #[test]
    fn ranks_are_written_as_runs() {
        assert_eq!(ranks_text(&[]), "");
        assert_eq!(ranks_text(&[5]), "5");
        assert_eq!(ranks_text(&[0, 1, 2, 3, 8, 9]), "0-3, 8-9");
        assert_eq!(ranks_text(&[0, 2, 4, 6]), "0, 2, 4, 6");
        assert_eq!(ranks_text(&[0, 2, 4, 6, 8]), "0, 2, 4, …, 8");
    }

    #[test]
    fn this_host_is_the_kernels_host_name() {
        // Without the test hook's variable (unset in this test process), the machine's name.
        if std::env::var_os(FAULT_HOST_ENV).is_some() {
            return;
        }
        let want = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(this_host(), want.trim());
        assert!(!this_host().is_empty());
    }

    #[test]
    fn a_single_process_mesh_has_one_host() {
        let mesh = Mesh::single(tch::Device::Cpu);
        assert_eq!(mesh.hosts().unwrap(), vec![this_host()]);
        let p = mesh.placement().unwrap();
        assert_eq!(p.node_count(), 1);
        assert!(p.cp_groups_across_hosts().is_empty());
    }
}
