//! SLURM's task variables turned into torchrun's, so that `srun <program>` (one task per GPU, no
//! torchrun) starts one multi-process run instead of N processes that each train alone.
//!
//! srun gives every task `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NODEID`, the
//! node list (`SLURM_STEP_NODELIST` / `SLURM_JOB_NODELIST`, compressed: `gpu[01-04,07],cpu3`),
//! the tasks per node (`SLURM_STEP_TASKS_PER_NODE` / `SLURM_TASKS_PER_NODE`, compressed:
//! `4(x2),3`), `SLURM_JOB_ID` and `SLURM_STEP_ID`. [`from_lookup`] computes the six variables
//! [`Rendezvous`] reads from them:
//!
//! | torchrun's | from |
//! |---|---|
//! | `RANK` | `SLURM_PROCID` |
//! | `WORLD_SIZE` | `SLURM_STEP_NUM_TASKS` (the step's), else `SLURM_NTASKS` |
//! | `LOCAL_RANK` | `SLURM_LOCALID` |
//! | `LOCAL_WORLD_SIZE` | the tasks per node, entry `SLURM_NODEID` |
//! | `MASTER_ADDR` | `MASTER_ADDR` if set (not loopback on several nodes), else the first host of the node list |
//! | `MASTER_PORT` | `MASTER_PORT` if set, else the first of `SLURM_STEP_RESV_PORTS`, else [`derived_port`]`(SLURM_JOB_ID, SLURM_STEP_ID)` |
//!
//! Nothing is computed when `WORLD_SIZE` is set (torchrun or a local launcher started the
//! process: theirs win), outside a job step (no `SLURM_STEP_ID`: the batch script's own shell,
//! where a program that took SLURM's job-wide variables would wait for ranks no one starts), or
//! when the step has one task (e.g. a batch script's `srun -n1` that starts its own ranks). The step's variables (`SLURM_STEP_*`) are preferred over the
//! job's where srun sets both: a step may run on part of the allocation, and rank 0 is the step's
//! first task, on the step's first node.
use crate::env::Rendezvous;

/// A SLURM variable that is missing or does not hold what srun writes there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlurmError {
    /// A variable srun sets for every task is not set.
    #[error(
        "SLURM variable {name} is not set; expected {expected} (srun sets it for every task it \
         starts: launch with `srun <program>`, or set torchrun's variables yourself)"
    )]
    Missing {
        /// The variable.
        name: &'static str,
        /// What it should hold.
        expected: String,
    },
    /// A variable is set to something unusable, or disagrees with another.
    #[error("SLURM variable {name}={value} is invalid; expected {expected}")]
    Invalid {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it should hold (and, where two disagree, the other's value).
        expected: String,
    },
}

/// Results of this module.
pub type Result<T> = std::result::Result<T, SlurmError>;

/// The lowest port [`derived_port`] gives.
pub const PORT_BASE: u16 = 15000;
/// The number of ports [`derived_port`] spreads jobs over: a prime, so that two jobs' first
/// steps get one port only when their ids differ by a multiple of it. `PORT_BASE + PORT_SPAN` =
/// 29983 stays below Linux's ephemeral ports (32768–60999), which outgoing connections take.
pub const PORT_SPAN: u64 = 14983;
/// Steps of one job that get distinct ports (`SLURM_STEP_ID` 0..16).
pub const PORT_STEPS: u64 = 16;

/// The rendezvous port of a SLURM job's step when `MASTER_PORT` is not set:
/// `15000 + (16·job_id + step_id) mod 14983`. Every task of the step computes the same port;
/// jobs with consecutive ids (the usual neighbours on a node) get ports 16 apart, the steps of
/// one job consecutive ones; a requeued job (same id, steps numbered from 0 again) gets its
/// earlier port back.
pub fn derived_port(job_id: u64, step_id: u64) -> u16 {
    let offset = (job_id % PORT_SPAN) * PORT_STEPS + step_id % PORT_SPAN;
    // offset mod 14983 < 14983, so the sum is at most 29982.
    PORT_BASE + (offset % PORT_SPAN) as u16
}

/// Where `MASTER_ADDR` / `MASTER_PORT` came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The variable itself was already set (it wins).
    Given,
    /// The first host of this node-list variable.
    FirstHost(&'static str),
    /// [`derived_port`] of the job and step ids.
    JobId,
    /// The first of the ports SLURM reserved for the step (`SLURM_STEP_RESV_PORTS`).
    Reserved,
}

/// A task of a multi-task SLURM step, as torchrun's variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmTask {
    /// The six variables (never agent-store mode: rank 0 hosts the store).
    pub rendezvous: Rendezvous,
    /// `SLURM_JOB_ID`, if set.
    pub job_id: Option<String>,
    /// `SLURM_STEP_ID` (srun sets it; a batch script's own environment does not, and no task
    /// is adopted there).
    pub step_id: Option<u64>,
    /// The variable the world size was read from (`SLURM_STEP_NUM_TASKS`, or `SLURM_NTASKS`).
    pub ntasks_var: &'static str,
    /// The variable the tasks per node were read from.
    pub tasks_per_node_var: &'static str,
    /// Where `MASTER_ADDR` came from.
    pub addr_from: Source,
    /// Where `MASTER_PORT` came from.
    pub port_from: Source,
}

impl SlurmTask {
    /// torchrun's six variables, for the process to export.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        self.rendezvous.to_env()
    }

    /// One line saying what was taken from which variable, e.g. `SLURM job 1234 (no torchrun):
    /// rank 0 of 8 (SLURM_PROCID/SLURM_NTASKS), 4 on this node (SLURM_TASKS_PER_NODE),
    /// rendezvous gpu01:16234 (first host of SLURM_JOB_NODELIST; port from the job id, set
    /// MASTER_PORT to choose)`.
    pub fn describe(&self) -> String {
        let r = &self.rendezvous;
        let job = self.job_id.as_deref().unwrap_or("(no SLURM_JOB_ID)");
        let addr = match &self.addr_from {
            Source::FirstHost(var) => format!("first host of {var}"),
            _ => "MASTER_ADDR".to_string(),
        };
        let port = match &self.port_from {
            Source::JobId => "port from the job and step ids, set MASTER_PORT to choose",
            Source::Reserved => "port reserved by SLURM for the step (SLURM_STEP_RESV_PORTS)",
            _ => "MASTER_PORT",
        };
        format!(
            "SLURM job {job} (no torchrun): rank {} of {} (SLURM_PROCID/{}), {} on this node \
             ({}), rendezvous {}:{} ({addr}; {port})",
            r.rank,
            r.world_size,
            self.ntasks_var,
            r.local_world_size,
            self.tasks_per_node_var,
            r.master_addr,
            r.master_port
        )
    }
}

/// [`from_lookup`] on the process environment.
pub fn from_env() -> Result<Option<SlurmTask>> {
    from_lookup(|name| std::env::var(name).ok())
}

/// The variables that say "a task srun started", in the order they are looked for.
const STEP_ID_VARS: [&str; 2] = ["SLURM_STEP_ID", "SLURM_STEPID"];
/// The step's task count first: a step may run fewer tasks than the job (`srun -n2` in a job of
/// 16 tasks), and the job's count (`SLURM_NTASKS`) would make every rank wait for ranks that
/// never start.
const NTASKS_VARS: [&str; 2] = ["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"];

/// torchrun's variables from SLURM's, read through `lookup` (the environment, or a map in
/// tests). `Ok(None)`: nothing to do: `WORLD_SIZE` is set (torchrun or a launcher knows
/// better), this is not a task of a job step (no `SLURM_STEP_ID`: the batch script's own shell,
/// salloc's shell, a login shell that inherited a job's variables), or the step has one task.
/// A missing, malformed or inconsistent SLURM variable is an error naming it, its value and
/// what was expected.
pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<SlurmTask>> {
    if lookup("WORLD_SIZE").is_some() {
        return Ok(None);
    }
    let get = |name: &str| lookup(name).map(|v| v.trim().to_string());
    let Some((step_var, step_text)) = first_set(&get, &STEP_ID_VARS) else {
        return Ok(None);
    };
    let step_id = number(step_var, &step_text, "the job step's number (srun sets it)")?;
    let Some((ntasks_var, ntasks_text)) = first_set(&get, &NTASKS_VARS) else {
        return Ok(None);
    };
    let ntasks = number(ntasks_var, &ntasks_text, "the number of tasks, at least 1")?;
    if ntasks == 0 {
        return Err(invalid(
            ntasks_var,
            &ntasks_text,
            "the number of tasks, at least 1",
        ));
    }
    if ntasks == 1 {
        return Ok(None);
    }
    let task = TaskPlace::read(&get, ntasks_var, ntasks)?;
    let (master_addr, addr_from) = master_addr(&get, &task)?;
    let job_id = get("SLURM_JOB_ID")
        .or_else(|| get("SLURM_JOBID"))
        .filter(|v| !v.is_empty());
    let (master_port, port_from) = master_port(&get, job_id.as_deref(), step_id)?;
    let rendezvous = Rendezvous {
        master_addr,
        master_port,
        rank: to_usize(task.rank),
        world_size: to_usize(ntasks),
        local_rank: to_usize(task.local_rank),
        local_world_size: to_usize(task.local_world_size),
        agent_store: None,
    };
    // Everything above was checked against each other; this catches what a future change
    // would miss, in Rendezvous's own words.
    rendezvous.validate().map_err(|e| SlurmError::Invalid {
        name: ntasks_var,
        value: ntasks_text.clone(),
        expected: e.to_string(),
    })?;
    Ok(Some(SlurmTask {
        rendezvous,
        job_id,
        step_id: Some(step_id),
        ntasks_var,
        tasks_per_node_var: task.tasks_var,
        addr_from,
        port_from,
    }))
}

/// Where a task sits in its step: its ranks, its node's task count, and the step's hosts.
struct TaskPlace {
    rank: u64,
    local_rank: u64,
    local_world_size: u64,
    /// The step's nodes.
    nodes: u64,
    /// The variable the tasks per node were read from.
    tasks_var: &'static str,
    /// The node-list variable and its first host, where one is set.
    first_host: Option<(&'static str, String)>,
}

impl TaskPlace {
    /// Reads the task's rank, local rank and node, the tasks per node and the node list, each
    /// checked against the ones read before it.
    fn read(
        get: &impl Fn(&str) -> Option<String>,
        ntasks_var: &'static str,
        ntasks: u64,
    ) -> Result<TaskPlace> {
        let required_number = |name: &'static str, expected: &str| -> Result<u64> {
            let text = get(name)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| SlurmError::Missing {
                    name,
                    expected: expected.to_string(),
                })?;
            number(name, &text, expected)
        };
        let rank = required_number(
            "SLURM_PROCID",
            &format!("this task's rank, 0..{ntasks_var}-1 = 0..{}", ntasks - 1),
        )?;
        if rank >= ntasks {
            return Err(invalid(
                "SLURM_PROCID",
                &rank.to_string(),
                &format!("a rank below {ntasks_var}={ntasks}"),
            ));
        }
        let local_rank = required_number("SLURM_LOCALID", "this task's rank on its node")?;
        let node = required_number("SLURM_NODEID", "the index of this task's node in the step")?;
        let (tasks_var, tasks_text) =
            first_set(get, &["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]).ok_or_else(
                || SlurmError::Missing {
                    name: "SLURM_TASKS_PER_NODE",
                    expected: "the tasks on each node, e.g. 4(x2),3".into(),
                },
            )?;
        let tasks = TasksPerNode::parse(&tasks_text)
            .map_err(|why| invalid(tasks_var, &tasks_text, &why))?;
        if tasks.total() != Some(ntasks) {
            let sum = tasks
                .total()
                .map_or_else(|| "more than 2^64".to_string(), |t| t.to_string());
            return Err(invalid(
                tasks_var,
                &tasks_text,
                &format!(
                    "tasks per node that add up to {ntasks_var}={ntasks} (they add up to {sum})"
                ),
            ));
        }
        let local_world_size = tasks.on_node(node).ok_or_else(|| {
            invalid(
                "SLURM_NODEID",
                &node.to_string(),
                &format!(
                    "a node index below the {} node(s) of {tasks_var}={tasks_text}",
                    tasks.nodes()
                ),
            )
        })?;
        if local_rank >= local_world_size {
            return Err(invalid(
                "SLURM_LOCALID",
                &local_rank.to_string(),
                &format!(
                    "a rank below the {local_world_size} task(s) of node {node} \
                     ({tasks_var}={tasks_text}, SLURM_NODEID={node})"
                ),
            ));
        }
        let first_host = first_host(get, tasks.nodes(), tasks_var, &tasks_text)?;
        Ok(TaskPlace {
            rank,
            local_rank,
            local_world_size,
            nodes: tasks.nodes(),
            tasks_var,
            first_host,
        })
    }
}

/// The node list's first host, read whenever a node list is set (it must name one host per
/// node of the tasks per node).
fn first_host(
    get: &impl Fn(&str) -> Option<String>,
    nodes: u64,
    tasks_var: &str,
    tasks_text: &str,
) -> Result<Option<(&'static str, String)>> {
    let vars = [
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
    ];
    let Some((var, text)) = first_set(get, &vars) else {
        return Ok(None);
    };
    let hosts = HostList::parse(&text).map_err(|why| invalid(var, &text, &why))?;
    if hosts.len() != Some(nodes) {
        return Err(invalid(
            var,
            &text,
            &format!(
                "one host per node of {tasks_var}={tasks_text} ({nodes} node(s)); it names {}",
                hosts
                    .len()
                    .map_or_else(|| "more than 2^64".to_string(), |n| n.to_string())
            ),
        ));
    }
    Ok(Some((var, hosts.first())))
}

/// Whether `addr` names this host's loopback interface, which no other node reaches.
fn is_loopback(addr: &str) -> bool {
    addr.eq_ignore_ascii_case("localhost")
        || addr
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Rank 0's address: `MASTER_ADDR` where set (a loopback one only when the step has one node:
/// a value left over from a single-node test would send every other node's ranks to
/// themselves), else the node list's first host, which must be rank 0's.
fn master_addr(
    get: &impl Fn(&str) -> Option<String>,
    task: &TaskPlace,
) -> Result<(String, Source)> {
    if let Some(addr) = get("MASTER_ADDR").filter(|v| !v.is_empty()) {
        if task.nodes > 1 && is_loopback(&addr) {
            return Err(invalid(
                "MASTER_ADDR",
                &addr,
                &format!(
                    "rank 0's host as the other {} node(s) reach it, not a loopback address \
                     (unset MASTER_ADDR to take the first host of the node list)",
                    task.nodes - 1
                ),
            ));
        }
        return Ok((addr, Source::Given));
    }
    let Some((var, host)) = task.first_host.clone() else {
        return Err(SlurmError::Missing {
            name: "SLURM_JOB_NODELIST",
            expected: "the job's hosts, e.g. gpu[01-04] (or set MASTER_ADDR to rank 0's host)"
                .into(),
        });
    };
    // Rank 0 hosts the store; if it is not on the first host, every other rank would wait at
    // an address where no store listens.
    if task.rank == 0 {
        if let Some(here) = get("SLURMD_NODENAME").filter(|v| !v.is_empty()) {
            if here != host {
                return Err(invalid(
                    "SLURMD_NODENAME",
                    &here,
                    &format!(
                        "rank 0 (SLURM_PROCID=0) on {host}, the first host of {var} (set \
                         MASTER_ADDR to rank 0's host for this task layout)"
                    ),
                ));
            }
        }
    }
    Ok((host, Source::FirstHost(var)))
}

/// The rendezvous port: `MASTER_PORT` where set; else the first of the ports SLURM reserved for
/// the step (`SLURM_STEP_RESV_PORTS`, with `MpiParams=ports=…` in slurm.conf or `srun
/// --resv-ports`: SLURM hands no port to two steps on a node at once); else [`derived_port`] of
/// the job and step ids.
fn master_port(
    get: &impl Fn(&str) -> Option<String>,
    job_id: Option<&str>,
    step_id: u64,
) -> Result<(u16, Source)> {
    if let Some(text) = get("MASTER_PORT").filter(|v| !v.is_empty()) {
        return match text.parse::<u16>() {
            Ok(p) if p > 0 => Ok((p, Source::Given)),
            // Not a SLURM variable, but read here, so named here.
            _ => Err(invalid(
                "MASTER_PORT",
                &text,
                "a free TCP port on rank 0's host, 1..=65535",
            )),
        };
    }
    if let Some(text) = get("SLURM_STEP_RESV_PORTS").filter(|v| !v.is_empty()) {
        let first = text.split([',', '-']).next().unwrap_or_default();
        return match first.parse::<u16>() {
            Ok(p) if p > 0 => Ok((p, Source::Reserved)),
            _ => Err(invalid(
                "SLURM_STEP_RESV_PORTS",
                &text,
                "the ports SLURM reserved for the step, e.g. 12000-12001",
            )),
        };
    }
    let Some(text) = job_id else {
        return Err(SlurmError::Missing {
            name: "SLURM_JOB_ID",
            expected: "the job's number, from which the rendezvous port is derived (or set \
                       MASTER_PORT)"
                .into(),
        });
    };
    let id = number("SLURM_JOB_ID", text, "the job's number")?;
    Ok((derived_port(id, step_id), Source::JobId))
}

fn invalid(name: &'static str, value: &str, expected: &str) -> SlurmError {
    SlurmError::Invalid {
        name,
        value: value.to_string(),
        expected: expected.to_string(),
    }
}

fn number(name: &'static str, text: &str, expected: &str) -> Result<u64> {
    text.trim()
        .parse::<u64>()
        .map_err(|_| invalid(name, text, &format!("a non-negative integer: {expected}")))
}

/// Counts that fit a u64 fit a usize on the 64-bit hosts SLURM and libtorch run on; elsewhere
/// they saturate, which the rendezvous's own checks then refuse.
fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// The first of `names` that is set (possibly empty), with its value.
fn first_set(
    get: &impl Fn(&str) -> Option<String>,
    names: &[&'static str],
) -> Option<(&'static str, String)> {
    names
        .iter()
        .find_map(|&name| get(name).map(|value| (name, value)))
}

/// SLURM's tasks-per-node list (`SLURM_TASKS_PER_NODE`): comma-separated counts, each `N` (one
/// node with N tasks) or `N(xM)` (M nodes with N tasks each), e.g. `2(x3),1` = 2, 2, 2, 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TasksPerNode {
    /// (tasks per node, nodes) runs, in node order.
    runs: Vec<(u64, u64)>,
}

impl TasksPerNode {
    /// Parses the compressed form; the error says what is wrong.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("the tasks on each node, e.g. 4(x2),3; it is empty".into());
        }
        let mut runs = Vec::new();
        for item in text.split(',') {
            let bad =
                |why: &str| format!("the tasks on each node, e.g. 4(x2),3: item {item:?} {why}");
            let (count, repeat) = match item.split_once('(') {
                None => (item, "1"),
                Some((count, rest)) => {
                    let repeat = rest
                        .strip_prefix('x')
                        .and_then(|r| r.strip_suffix(')'))
                        .ok_or_else(|| bad("is not N or N(xM)"))?;
                    (count, repeat)
                }
            };
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            if !digits(count) || !digits(repeat) {
                return Err(bad("is not N or N(xM)"));
            }
            let count: u64 = count.parse().map_err(|_| bad("is too large"))?;
            let repeat: u64 = repeat.parse().map_err(|_| bad("is too large"))?;
            if count == 0 || repeat == 0 {
                return Err(bad("has no tasks or no nodes"));
            }
            runs.push((count, repeat));
        }
        Ok(TasksPerNode { runs })
    }

    /// The number of nodes (saturating).
    pub fn nodes(&self) -> u64 {
        self.runs
            .iter()
            .fold(0u64, |n, &(_, repeat)| n.saturating_add(repeat))
    }

    /// The number of tasks on all nodes (`None` past u64).
    pub fn total(&self) -> Option<u64> {
        self.runs.iter().try_fold(0u64, |sum, &(count, repeat)| {
            sum.checked_add(count.checked_mul(repeat)?)
        })
    }

    /// The number of tasks on node `node` (0-based), `None` past the last node.
    pub fn on_node(&self, mut node: u64) -> Option<u64> {
        for &(count, repeat) in &self.runs {
            if node < repeat {
                return Some(count);
            }
            node -= repeat;
        }
        None
    }
}

/// A SLURM hostlist (`SLURM_JOB_NODELIST`): comma-separated entries, each a host name with
/// optional bracket groups of numbers and ranges (`gpu[01-04,07]` = gpu01 … gpu04, gpu07; the
/// lower bound's digits give the width, zeros included). Commas inside brackets belong to the
/// group. An entry with several groups (`rack[1-2]n[1-3]`) is their product, the first group
/// varying slowest, as SLURM writes it. Kept compressed: [`len`](Self::len) and
/// [`first`](Self::first) never expand it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostList {
    entries: Vec<Vec<Part>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    /// `[lo-hi,…]`: inclusive ranges, each with its zero-padded width.
    Numbers(Vec<NumberRange>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct NumberRange {
    lo: u64,
    hi: u64,
    width: usize,
}

impl NumberRange {
    fn len(&self) -> u64 {
        // lo ≤ hi is checked when parsed; a full u64 range saturates.
        (self.hi - self.lo).saturating_add(1)
    }
}

const HOSTLIST_EXPECTED: &str = "a SLURM hostlist such as gpu[01-04,07],cpu3";

impl HostList {
    /// Parses the compressed form; the error says what is wrong (with an example of the form).
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err(format!("{HOSTLIST_EXPECTED}; it is empty"));
        }
        let mut entries = Vec::new();
        for entry in split_top_level(text)? {
            entries.push(parse_entry(entry)?);
        }
        Ok(HostList { entries })
    }

    /// The number of hosts (`None` past u64).
    pub fn len(&self) -> Option<u64> {
        self.entries.iter().try_fold(0u64, |sum, entry| {
            let n = entry.iter().try_fold(1u64, |n, part| match part {
                Part::Text(_) => Some(n),
                Part::Numbers(ranges) => {
                    let here = ranges
                        .iter()
                        .try_fold(0u64, |s, r| s.checked_add(r.len()))?;
                    n.checked_mul(here)
                }
            })?;
            sum.checked_add(n)
        })
    }

    /// Whether the list names no host (never, once parsed).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The first host (rank 0's, under SLURM's default task distribution).
    pub fn first(&self) -> String {
        self.entries
            .first()
            .map(|entry| {
                entry
                    .iter()
                    .map(|part| match part {
                        Part::Text(t) => t.clone(),
                        Part::Numbers(ranges) => ranges
                            .first()
                            .map(|r| format!("{:0w$}", r.lo, w = r.width))
                            .unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every host, in order, or `None` if there are more than `limit`.
    pub fn expand(&self, limit: u64) -> Option<Vec<String>> {
        if self.len()? > limit {
            return None;
        }
        let mut hosts = Vec::new();
        for entry in &self.entries {
            let mut names = vec![String::new()];
            for part in entry {
                names = match part {
                    Part::Text(t) => names.into_iter().map(|n| n + t).collect(),
                    Part::Numbers(ranges) => names
                        .iter()
                        .flat_map(|n| {
                            ranges.iter().flat_map(move |r| {
                                (r.lo..=r.hi).map(move |i| format!("{n}{i:0w$}", w = r.width))
                            })
                        })
                        .collect(),
                };
            }
            hosts.extend(names);
        }
        Some(hosts)
    }
}

/// The entries of a hostlist: split at commas outside brackets.
fn split_top_level(text: &str) -> std::result::Result<Vec<&str>, String> {
    let mut entries = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '[' if depth > 0 => {
                return Err(format!(
                    "{HOSTLIST_EXPECTED}: a '[' inside brackets at byte {i}"
                ))
            }
            '[' => depth = 1,
            ']' if depth == 0 => {
                return Err(format!(
                    "{HOSTLIST_EXPECTED}: a ']' without its '[' at byte {i}"
                ))
            }
            ']' => depth = 0,
            ',' if depth == 0 => {
                entries.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err(format!("{HOSTLIST_EXPECTED}: a '[' is never closed"));
    }
    entries.push(&text[start..]);
    Ok(entries)
}

/// One entry: text and bracket groups.
fn parse_entry(entry: &str) -> std::result::Result<Vec<Part>, String> {
    if entry.is_empty() {
        return Err(format!(
            "{HOSTLIST_EXPECTED}: an empty entry between commas"
        ));
    }
    let mut parts = Vec::new();
    let mut rest = entry;
    while !rest.is_empty() {
        match rest.find('[') {
            Some(0) => {
                // split_top_level saw every '[' closed.
                let close = rest.find(']').ok_or_else(|| {
                    format!("{HOSTLIST_EXPECTED}: a '[' is never closed in {entry:?}")
                })?;
                parts.push(Part::Numbers(parse_group(&rest[1..close], entry)?));
                rest = &rest[close + 1..];
            }
            at => {
                let end = at.unwrap_or(rest.len());
                let text = &rest[..end];
                if let Some(c) = text
                    .chars()
                    .find(|c| c.is_whitespace() || c.is_control() || *c == ']')
                {
                    return Err(format!(
                        "{HOSTLIST_EXPECTED}: {c:?} in the host name {entry:?}"
                    ));
                }
                parts.push(Part::Text(text.to_string()));
                rest = &rest[end..];
            }
        }
    }
    Ok(parts)
}

/// The inside of `[…]`: `N` or `LO-HI`, comma-separated.
fn parse_group(group: &str, entry: &str) -> std::result::Result<Vec<NumberRange>, String> {
    let bad = |why: String| format!("{HOSTLIST_EXPECTED}: {why} in {entry:?}");
    if group.is_empty() {
        return Err(bad("empty brackets".into()));
    }
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mut ranges = Vec::new();
    for item in group.split(',') {
        let (lo_text, hi_text) = item.split_once('-').unwrap_or((item, item));
        if !digits(lo_text) || !digits(hi_text) {
            return Err(bad(format!("{item:?} is not a number or a range LO-HI")));
        }
        let lo: u64 = lo_text
            .parse()
            .map_err(|_| bad(format!("{lo_text} is too large")))?;
        let hi: u64 = hi_text
            .parse()
            .map_err(|_| bad(format!("{hi_text} is too large")))?;
        if lo > hi {
            return Err(bad(format!("the range {item} runs backwards")));
        }
        ranges.push(NumberRange {
            lo,
            hi,
            width: lo_text.len(),
        });
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn hosts(text: &str) -> Vec<String> {
        HostList::parse(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .expand(10_000)
            .unwrap()
    }

    #[test]
    fn hostlists_expand_as_slurm_writes_them() {
        let cases: &[(&str, &[&str])] = &[
            ("localhost", &["localhost"]),
            ("gpu01", &["gpu01"]),
            (
                "gpu[01-04,07],cpu3",
                &["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"],
            ),
            ("n[8-11]", &["n8", "n9", "n10", "n11"]),
            ("n[08-11]", &["n08", "n09", "n10", "n11"]),
            ("n[098-101]", &["n098", "n099", "n100", "n101"]),
            ("a,b,c", &["a", "b", "c"]),
            ("node-[1,3]-ib", &["node-1-ib", "node-3-ib"]),
            ("r[1-2]n[1-2]", &["r1n1", "r1n2", "r2n1", "r2n2"]),
            ("x[5]", &["x5"]),
            ("[1-2]", &["1", "2"]),
            (
                "gpu[1-2],cpu[01,03],login.cluster.org",
                &["gpu1", "gpu2", "cpu01", "cpu03", "login.cluster.org"],
            ),
            ("h[0-0]", &["h0"]),
        ];
        for (text, want) in cases {
            assert_eq!(hosts(text), *want, "{text}");
            let list = HostList::parse(text).unwrap();
            assert_eq!(list.first(), want[0], "{text}");
            assert_eq!(list.len(), Some(want.len() as u64), "{text}");
        }
    }

    #[test]
    fn huge_hostlists_are_counted_without_being_expanded() {
        let list = HostList::parse("n[0000000-9999999],m[0-99999999]").unwrap();
        assert_eq!(list.len(), Some(10_000_000 + 100_000_000));
        assert_eq!(list.first(), "n0000000");
        assert_eq!(list.expand(1000), None);
        let overflow = HostList::parse("a[0-18446744073709551615]b[0-1]").unwrap();
        assert_eq!(overflow.len(), None);
    }

    #[test]
    fn malformed_hostlists_are_refused_saying_what_is_wrong() {
        let cases = [
            ("", "empty"),
            ("   ", "empty"),
            ("gpu[01-04", "never closed"),
            ("gpu01-04]", "without its '['"),
            ("gpu[[1]]", "inside brackets"),
            ("gpu[]", "empty brackets"),
            ("gpu[a-b]", "not a number"),
            ("gpu[1-]", "not a number"),
            ("gpu[-3]", "not a number"),
            ("gpu[1-2-3]", "not a number"),
            ("gpu[1:2]", "not a number"),
            ("gpu[4-2]", "runs backwards"),
            ("gpu[1,,2]", "not a number"),
            ("a,,b", "empty entry"),
            ("a,", "empty entry"),
            ("a b", "in the host name"),
            ("gpu[99999999999999999999]", "too large"),
        ];
        for (text, why) in cases {
            let e = HostList::parse(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
            assert!(e.contains("gpu[01-04,07],cpu3"), "{text:?}: {e}");
        }
    }

    /// A small deterministic generator (no dependency): SplitMix64.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Compresses hosts `prefix` + zero-padded number as SLURM does: runs of consecutive numbers
    /// of one width into ranges, one bracket group per prefix.
    fn compress(prefix: &str, width: usize, numbers: &[u64]) -> String {
        let mut items = Vec::new();
        let mut i = 0;
        while i < numbers.len() {
            let mut j = i;
            while j + 1 < numbers.len() && numbers[j + 1] == numbers[j] + 1 {
                j += 1;
            }
            items.push(if i == j {
                format!("{:0w$}", numbers[i], w = width)
            } else {
                format!("{:0w$}-{:0w$}", numbers[i], numbers[j], w = width)
            });
            i = j + 1;
        }
        format!("{prefix}[{}]", items.join(","))
    }

    #[test]
    fn random_hostlists_round_trip_through_their_compressed_form() {
        let mut rng = Rng(7);
        for case in 0..500 {
            let mut want = Vec::new();
            let mut entries = Vec::new();
            for g in 0..1 + rng.below(4) {
                let prefix = ["gpu", "cpu-", "n", "rack1-node", "x.y"][rng.below(5) as usize];
                let prefix = format!("{prefix}{g}");
                let width = 1 + rng.below(4) as usize;
                // Numbers that fit the width, so the padding is exact.
                let top = 10u64.pow(width as u32);
                let mut numbers: Vec<u64> =
                    (0..1 + rng.below(12)).map(|_| rng.below(top)).collect();
                numbers.sort_unstable();
                numbers.dedup();
                if rng.below(3) == 0 && numbers.len() == 1 {
                    // A plain host name, no brackets.
                    let name = format!("{prefix}{:0w$}", numbers[0], w = width);
                    entries.push(name.clone());
                    want.push(name);
                    continue;
                }
                want.extend(
                    numbers
                        .iter()
                        .map(|n| format!("{prefix}{n:0w$}", w = width)),
                );
                entries.push(compress(&prefix, width, &numbers));
            }
            let text = entries.join(",");
            let list =
                HostList::parse(&text).unwrap_or_else(|e| panic!("case {case}: {text}: {e}"));
            assert_eq!(list.expand(10_000).unwrap(), want, "case {case}: {text}");
            assert_eq!(list.first(), want[0], "case {case}: {text}");
            assert_eq!(list.len(), Some(want.len() as u64), "case {case}: {text}");
        }
    }

    #[test]
    fn tasks_per_node_expand_and_index() {
        let t = TasksPerNode::parse("2(x3),1").unwrap();
        assert_eq!(t.nodes(), 4);
        assert_eq!(t.total(), Some(7));
        let per_node: Vec<_> = (0..5).map(|n| t.on_node(n)).collect();
        assert_eq!(per_node, [Some(2), Some(2), Some(2), Some(1), None]);
        assert_eq!(TasksPerNode::parse("8").unwrap().on_node(0), Some(8));
        assert_eq!(TasksPerNode::parse("4(x2),3").unwrap().total(), Some(11));
        for bad in [
            "", "x", "2(x)", "2(3)", "2(x3", "(x3)", "0", "2(x0)", "2,,1", "-1", "2(x3)1",
        ] {
            let e = TasksPerNode::parse(bad).unwrap_err();
            assert!(e.contains("4(x2),3"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn derived_ports_stay_below_the_ephemeral_range_and_apart() {
        assert_eq!(derived_port(0, 0), 15000);
        assert_eq!(derived_port(1234, 0), 15000 + (1234 * 16) % 14983);
        assert_eq!(derived_port(1234, 1), derived_port(1234, 0) + 1);
        for job in [0, 1, 77, 14982, 14983, 1 << 40, u64::MAX] {
            for step in [0, 1, 15, 16, 1000, u64::MAX] {
                let p = derived_port(job, step);
                assert!((15000..29983).contains(&p), "{job}.{step}: {p}");
            }
        }
        // Neighbouring jobs, and the first 16 steps of each, get distinct ports.
        let mut seen = std::collections::HashSet::new();
        for job in 5000..5100 {
            for step in 0..16 {
                assert!(seen.insert(derived_port(job, step)), "{job}.{step}");
            }
        }
    }

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    /// Task 5 of 7 on the third of four nodes (2, 2, 2, 1 tasks).
    const TASK: [(&str, &str); 8] = [
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "7"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "2"),
        ("SLURM_JOB_NODELIST", "gpu[01-03],cpu7"),
        ("SLURM_TASKS_PER_NODE", "2(x3),1"),
        ("SLURM_JOB_ID", "1234"),
        ("SLURM_STEP_ID", "1"),
    ];

    /// A variable set to a value, or removed (`None`).
    type Change = (&'static str, Option<&'static str>);

    fn with(changes: &[Change]) -> Vec<(&'static str, &'static str)> {
        let mut vars: Vec<_> = TASK.to_vec();
        for &(name, value) in changes {
            vars.retain(|(k, _)| *k != name);
            if let Some(v) = value {
                vars.push((name, v));
            }
        }
        vars
    }

    #[test]
    fn a_task_gets_torchruns_six_variables() {
        let task = from_lookup(lookup(&TASK)).unwrap().unwrap();
        assert_eq!(
            task.rendezvous,
            Rendezvous {
                master_addr: "gpu01".into(),
                master_port: derived_port(1234, 1),
                rank: 5,
                world_size: 7,
                local_rank: 1,
                local_world_size: 2,
                agent_store: None,
            }
        );
        assert_eq!(task.addr_from, Source::FirstHost("SLURM_JOB_NODELIST"));
        assert_eq!(task.port_from, Source::JobId);
        // What the process exports reads back as the same rendezvous.
        let env = task.to_env();
        let back =
            Rendezvous::from_lookup(|n| env.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone()))
                .unwrap();
        assert_eq!(back, task.rendezvous);
        // The last node has one task.
        let last = from_lookup(lookup(&with(&[
            ("SLURM_PROCID", Some("6")),
            ("SLURM_NODEID", Some("3")),
            ("SLURM_LOCALID", Some("0")),
        ])))
        .unwrap()
        .unwrap();
        assert_eq!(last.rendezvous.local_world_size, 1);
    }

    #[test]
    fn the_description_names_each_source() {
        let rank0 = with(&[
            ("SLURM_PROCID", Some("0")),
            ("SLURM_NODEID", Some("0")),
            ("SLURM_LOCALID", Some("0")),
        ]);
        let line = from_lookup(lookup(&rank0)).unwrap().unwrap().describe();
        let port = derived_port(1234, 1);
        assert_eq!(
            line,
            format!(
                "SLURM job 1234 (no torchrun): rank 0 of 7 (SLURM_PROCID/SLURM_NTASKS), 2 on this \
                 node (SLURM_TASKS_PER_NODE), rendezvous gpu01:{port} (first host of \
                 SLURM_JOB_NODELIST; port from the job and step ids, set MASTER_PORT to choose)"
            )
        );
        let reserved = [
            rank0.as_slice(),
            &[("SLURM_STEP_RESV_PORTS", "12007-12008")],
        ]
        .concat();
        let line = from_lookup(lookup(&reserved)).unwrap().unwrap().describe();
        assert!(
            line.ends_with(
                "rendezvous gpu01:12007 (first host of SLURM_JOB_NODELIST; port reserved by SLURM \
                 for the step (SLURM_STEP_RESV_PORTS))"
            ),
            "{line}"
        );
        let given = with(&[
            ("MASTER_ADDR", Some("10.0.0.1")),
            ("MASTER_PORT", Some("29400")),
        ]);
        let line = from_lookup(lookup(&given)).unwrap().unwrap().describe();
        assert!(
            line.ends_with("rendezvous 10.0.0.1:29400 (MASTER_ADDR; MASTER_PORT)"),
            "{line}"
        );
    }

    #[test]
    fn set_master_variables_win() {
        let task = from_lookup(lookup(&with(&[
            ("MASTER_ADDR", Some("head")),
            ("MASTER_PORT", Some("29500")),
        ])))
        .unwrap()
        .unwrap();
        assert_eq!(task.rendezvous.master_addr, "head");
        assert_eq!(task.rendezvous.master_port, 29500);
        assert_eq!(
            (task.addr_from, task.port_from),
            (Source::Given, Source::Given)
        );
        // With MASTER_ADDR and MASTER_PORT set, neither the node list nor the job id is needed.
        let task = from_lookup(lookup(&with(&[
            ("MASTER_ADDR", Some("head")),
            ("MASTER_PORT", Some("29500")),
            ("SLURM_JOB_NODELIST", None),
            ("SLURM_JOB_ID", None),
        ])))
        .unwrap()
        .unwrap();
        assert_eq!(task.rendezvous.master_addr, "head");
    }

    #[test]
    fn the_steps_variables_win_over_the_jobs() {
        // A step on two of the allocation's nodes: its rank 0 is on gpu03, the step's first
        // host, not on gpu01, the job's.
        let task = from_lookup(lookup(&with(&[
            ("SLURM_STEP_NODELIST", Some("gpu03,cpu7")),
            ("SLURM_STEP_TASKS_PER_NODE", Some("2,1")),
            ("SLURM_NTASKS", Some("3")),
            ("SLURM_PROCID", Some("1")),
            ("SLURM_NODEID", Some("0")),
        ])))
        .unwrap()
        .unwrap();
        assert_eq!(task.rendezvous.master_addr, "gpu03");
        assert_eq!(task.rendezvous.local_world_size, 2);
        assert_eq!(task.addr_from, Source::FirstHost("SLURM_STEP_NODELIST"));
        assert_eq!(task.tasks_per_node_var, "SLURM_STEP_TASKS_PER_NODE");
    }

    #[test]
    fn the_steps_task_count_is_the_world_and_loopback_is_refused_across_nodes() {
        // `srun -n3` inside a job of 7 tasks: 3 ranks, all on the job's first node.
        let step = from_lookup(lookup(&with(&[
            ("SLURM_STEP_NUM_TASKS", Some("3")),
            ("SLURM_STEP_TASKS_PER_NODE", Some("3")),
            ("SLURM_STEP_NODELIST", Some("gpu01")),
            ("SLURM_NODEID", Some("0")),
            ("SLURM_PROCID", Some("2")),
            ("SLURM_LOCALID", Some("2")),
        ])))
        .unwrap()
        .unwrap();
        assert_eq!(step.rendezvous.world_size, 3);
        assert!(step
            .describe()
            .contains("rank 2 of 3 (SLURM_PROCID/SLURM_STEP_NUM_TASKS)"));
        // A loopback MASTER_ADDR is refused on several nodes, taken on one.
        for addr in ["localhost", "127.0.0.1", "127.1.2.3", "::1"] {
            let e = from_lookup(lookup(&with(&[("MASTER_ADDR", Some(addr))])))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("MASTER_ADDR={addr}")) && e.contains("not a loopback"),
                "{e}"
            );
        }
        let one_node = from_lookup(lookup(&with(&[
            ("MASTER_ADDR", Some("127.0.0.1")),
            ("SLURM_TASKS_PER_NODE", Some("7")),
            ("SLURM_JOB_NODELIST", Some("gpu01")),
            ("SLURM_NODEID", Some("0")),
        ])))
        .unwrap()
        .unwrap();
        assert_eq!(one_node.rendezvous.master_addr, "127.0.0.1");
        let e = from_lookup(lookup(&with(&[("SLURM_STEP_RESV_PORTS", Some("none"))])))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SLURM_STEP_RESV_PORTS=none"), "{e}");
    }

    #[test]
    fn nothing_is_done_under_torchrun_outside_a_step_or_for_one_task() {
        for changes in [
            vec![("WORLD_SIZE", Some("7"))],
            // The batch script's own shell: the job's variables, no step.
            vec![("SLURM_STEP_ID", None)],
            vec![("SLURM_STEP_ID", None), ("SLURM_PROCID", Some("x"))],
            vec![("SLURM_STEP_NUM_TASKS", Some("1"))],
            vec![("SLURM_NTASKS", None)],
            vec![("SLURM_NTASKS", Some("1"))],
            vec![("SLURM_NTASKS", Some(" 1 "))],
            // torchrun wins even over malformed SLURM variables.
            vec![
                ("WORLD_SIZE", Some("2")),
                ("SLURM_JOB_NODELIST", Some("gpu[1-")),
            ],
        ] {
            assert_eq!(
                from_lookup(lookup(&with(&changes))),
                Ok(None),
                "{changes:?}"
            );
        }
        assert_eq!(from_lookup(|_| None), Ok(None));
    }

    #[test]
    fn malformed_or_inconsistent_variables_name_the_variable_and_value() {
        // (changes to the task's variables, what the error names, what it expects)
        let cases: &[(&[Change], &str, &str)] = &[
            (
                &[("SLURM_NTASKS", Some("many"))],
                "SLURM_NTASKS=many",
                "integer",
            ),
            (
                &[("SLURM_NTASKS", Some("0"))],
                "SLURM_NTASKS=0",
                "at least 1",
            ),
            (&[("SLURM_PROCID", None)], "SLURM_PROCID is not set", "rank"),
            (
                &[("SLURM_PROCID", Some("7"))],
                "SLURM_PROCID=7",
                "below SLURM_NTASKS=7",
            ),
            (
                &[("SLURM_PROCID", Some("-1"))],
                "SLURM_PROCID=-1",
                "integer",
            ),
            (
                &[("SLURM_LOCALID", None)],
                "SLURM_LOCALID is not set",
                "node",
            ),
            (
                &[("SLURM_LOCALID", Some("2"))],
                "SLURM_LOCALID=2",
                "below the 2 task(s)",
            ),
            (
                &[("SLURM_NODEID", Some("4"))],
                "SLURM_NODEID=4",
                "below the 4 node(s)",
            ),
            (&[("SLURM_NODEID", None)], "SLURM_NODEID is not set", "node"),
            (
                &[("SLURM_TASKS_PER_NODE", None)],
                "SLURM_TASKS_PER_NODE is not set",
                "4(x2),3",
            ),
            (
                &[("SLURM_TASKS_PER_NODE", Some("2(x3)+1"))],
                "SLURM_TASKS_PER_NODE=2(x3)+1",
                "4(x2),3",
            ),
            (
                &[("SLURM_TASKS_PER_NODE", Some("2(x4)"))],
                "SLURM_TASKS_PER_NODE=2(x4)",
                "add up to SLURM_NTASKS=7 (they add up to 8)",
            ),
            (
                &[("SLURM_JOB_NODELIST", Some("gpu[01-03"))],
                "SLURM_JOB_NODELIST=gpu[01-03",
                "never closed",
            ),
            (
                &[("SLURM_JOB_NODELIST", Some("gpu[01-03]"))],
                "SLURM_JOB_NODELIST=gpu[01-03]",
                "(4 node(s)); it names 3",
            ),
            (
                &[("SLURM_JOB_NODELIST", None)],
                "SLURM_JOB_NODELIST is not set",
                "MASTER_ADDR",
            ),
            (
                &[("SLURM_JOB_ID", None)],
                "SLURM_JOB_ID is not set",
                "MASTER_PORT",
            ),
            (
                &[("SLURM_JOB_ID", Some("12a"))],
                "SLURM_JOB_ID=12a",
                "integer",
            ),
            (
                &[("SLURM_STEP_ID", Some("batch"))],
                "SLURM_STEP_ID=batch",
                "integer",
            ),
            (
                &[("MASTER_PORT", Some("70000"))],
                "MASTER_PORT=70000",
                "1..=65535",
            ),
            (&[("MASTER_PORT", Some("0"))], "MASTER_PORT=0", "1..=65535"),
        ];
        for (changes, names, expected) in cases {
            let e = from_lookup(lookup(&with(changes))).unwrap_err().to_string();
            assert!(e.contains(names), "{changes:?}: {e}");
            assert!(e.contains(expected), "{changes:?}: {e}");
        }
    }

    #[test]
    fn rank_0_on_another_host_than_the_first_is_refused() {
        let rank0 = [
            ("SLURM_PROCID", Some("0")),
            ("SLURM_NODEID", Some("0")),
            ("SLURM_LOCALID", Some("0")),
        ];
        let mut elsewhere = rank0.to_vec();
        elsewhere.push(("SLURMD_NODENAME", Some("gpu02")));
        let e = from_lookup(lookup(&with(&elsewhere)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("SLURMD_NODENAME=gpu02")
                && e.contains("gpu01, the first host of SLURM_JOB_NODELIST")
                && e.contains("set MASTER_ADDR"),
            "{e}"
        );
        let mut here = rank0.to_vec();
        here.push(("SLURMD_NODENAME", Some("gpu01")));
        assert!(from_lookup(lookup(&with(&here))).unwrap().is_some());
        // MASTER_ADDR given: the user placed rank 0.
        elsewhere.push(("MASTER_ADDR", Some("gpu02")));
        assert!(from_lookup(lookup(&with(&elsewhere))).unwrap().is_some());
    }
}
