//! Multi-process tests over Gloo on 127.0.0.1. A test launches N copies of this test binary, each
//! running one `rank_*` function (ignored in normal runs) as one rank with torchrun's variables
//! set; the ranks check their results against a single-process computation and exit non-zero on
//! a mismatch. Rendezvous failures are checked in-process, with threads as ranks.
use std::net::TcpListener;
use std::time::{Duration, Instant};

use rsd_dist::testing::{free_port, launch_ranks as launch, rank_world as world, LEFT, ROLE_ENV};
use rsd_dist::{
    Backend, DistError, FailureWatch, Mesh, MeshShape, ProcessGroup, ReduceOp, Rendezvous,
    WatchTimes,
};
use tch::{Device, Kind, Tensor};

/// The ranks' rendezvous and collective timeout: also how long they have to start, so a hang
/// guard long enough for a loaded machine, never a bound a test's outcome depends on.
const TIMEOUT: Duration = Duration::from_secs(120);

/// Rank `r`'s input in the collective checks: distinct on every rank and element.
fn input(r: usize, kind: Kind) -> Tensor {
    (Tensor::arange(12, (Kind::Float, Device::Cpu)).view([4, 3]) * (r as f64 + 1.0)
        - 5.0 * r as f64)
        .to_kind(kind)
}

fn same(a: &Tensor, b: &Tensor) -> bool {
    a.size() == b.size()
        && a.kind() == b.kind()
        && a.to_kind(Kind::Double)
            .allclose(&b.to_kind(Kind::Double), 1e-6, 1e-6, false)
}

#[test]
fn collectives_match_a_single_process() {
    launch("rank_collectives", 2);
}

/// Every collective of the process group, checked on each rank against the single-process result.
///
/// Long because: it is one sequence of checks that every rank runs in lockstep (each collective
/// must be entered in the same order on all ranks); split into helpers, that order would be spread
/// over several functions and the shared inputs passed between them.
#[test]
#[ignore = "one rank of collectives_match_a_single_process"]
fn rank_collectives() {
    let Some(pg) = world("rank_collectives", TIMEOUT) else {
        return;
    };
    let (rank, n) = (pg.rank(), pg.size());
    let all: Vec<Tensor> = (0..n).map(|r| input(r, Kind::Float)).collect();
    let stacked = Tensor::stack(&all, 0);

    for (op, want) in [
        (
            ReduceOp::Sum,
            stacked.sum_dim_intlist(0, false, Kind::Float),
        ),
        (ReduceOp::Avg, stacked.mean_dim(0, false, Kind::Float)),
        (ReduceOp::Max, stacked.amax(0, false)),
        (ReduceOp::Min, stacked.amin(0, false)),
    ] {
        let mut t = input(rank, Kind::Float);
        pg.all_reduce(&mut t, op).unwrap();
        assert!(same(&t, &want), "all_reduce {op:?}");
        let got = pg.reduce_scatter(&input(rank, Kind::Float), op).unwrap();
        assert!(
            same(&got, &want.chunk(n as i64, 0)[rank]),
            "reduce_scatter {op:?}"
        );
    }

    // Reduce-scatters in flight: two started before either is waited for, a blocking
    // collective between them, waited for in the other order; the inputs are dropped at once
    // (the pending collective holds its own). The calls and bytes count at the start.
    let before = pg.stats();
    let first = pg
        .reduce_scatter_start(&input(rank, Kind::Float), ReduceOp::Sum)
        .unwrap();
    let second = pg
        .reduce_scatter_start(&(input(rank, Kind::Double) * 2.0), ReduceOp::Avg)
        .unwrap();
    let mut between = Tensor::from_slice(&[rank as i64 + 1]);
    pg.all_reduce(&mut between, ReduceOp::Sum).unwrap();
    assert_eq!(i64::try_from(&between).unwrap(), (n * (n + 1) / 2) as i64);
    let sum = stacked.sum_dim_intlist(0, false, Kind::Float);
    let got_second = second.wait(&pg).unwrap();
    let got_first = first.wait(&pg).unwrap();
    assert!(
        same(&got_first, &sum.chunk(n as i64, 0)[rank]),
        "reduce_scatter_start sum"
    );
    let avg2 = (stacked.to_kind(Kind::Double) * 2.0).mean_dim(0, false, Kind::Double);
    assert!(
        same(&got_second, &avg2.chunk(n as i64, 0)[rank]),
        "reduce_scatter_start avg"
    );
    let after = pg.stats();
    assert_eq!(after.calls - before.calls, 3);
    assert_eq!(after.bytes - before.bytes, (12 * 4 + 12 * 8 + 8) as u64);
    let mut ints = input(rank, Kind::Int64);
    pg.all_reduce(&mut ints, ReduceOp::Sum).unwrap();
    assert!(same(
        &ints,
        &stacked
            .sum_dim_intlist(0, false, Kind::Float)
            .to_kind(Kind::Int64)
    ));

    let gathered = pg.all_gather(&input(rank, Kind::Double)).unwrap();
    assert!(same(&gathered, &Tensor::cat(&all, 0).to_kind(Kind::Double)));
    // A non-contiguous input is gathered by value.
    let gathered_t = pg.all_gather(&input(rank, Kind::Float).tr()).unwrap();
    let all_t: Vec<Tensor> = all.iter().map(|t| t.tr()).collect();
    assert!(same(&gathered_t, &Tensor::cat(&all_t, 0)));

    let mut b = input(rank, Kind::Float);
    pg.broadcast(&mut b, 1).unwrap();
    assert!(same(&b, &all[1]));

    let a2a = pg.all_to_all(&input(rank, Kind::Float)).unwrap();
    let want: Vec<Tensor> = all
        .iter()
        .map(|t| t.chunk(n as i64, 0)[rank].shallow_clone())
        .collect();
    assert!(same(&a2a, &Tensor::cat(&want, 0)));

    // Ping-pong: rank 0 sends its input, rank 1 answers with twice what it got.
    let mut got = Tensor::zeros([4, 3], (Kind::Float, Device::Cpu));
    if rank == 0 {
        pg.send(&all[0], 1).unwrap();
        pg.recv(&mut got, 1).unwrap();
        assert!(same(&got, &(&all[0] * 2.0)));
    } else {
        pg.recv(&mut got, 0).unwrap();
        assert!(same(&got, &all[0]));
        pg.send(&(&got * 2.0), 0).unwrap();
    }
    pg.barrier().unwrap();

    // Bad inputs are errors on every rank, and leave the group usable.
    let odd = Tensor::zeros([3, 2], (Kind::Float, Device::Cpu));
    let err = pg.reduce_scatter(&odd, ReduceOp::Sum).unwrap_err();
    assert!(
        matches!(
            err,
            DistError::Collective {
                op: "reduce_scatter",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("multiple of the group size"),
        "{err}"
    );
    assert!(matches!(
        pg.broadcast(&mut b, 2),
        Err(DistError::Input { .. })
    ));
    assert!(matches!(pg.send(&b, rank), Err(DistError::Input { .. })));
    let mut ints = input(rank, Kind::Int64);
    assert!(
        pg.all_reduce(&mut ints, ReduceOp::Avg).is_err(),
        "the mean of integers"
    );
    pg.barrier().unwrap();
}

#[test]
fn autograd_collectives_match_single_process_gradients() {
    launch("rank_autograd", 2);
}

/// Rank `r`'s upstream gradient (different on every rank, so a wrong sum shows).
fn weight(r: usize, shape: &[i64]) -> Tensor {
    let numel: i64 = shape.iter().product();
    (Tensor::arange(numel, (Kind::Double, Device::Cpu)) * 0.1 + r as f64)
        .view(shape)
        .sin()
}

fn leaf(r: usize, shape: &[i64]) -> Tensor {
    let numel: i64 = shape.iter().product();
    (Tensor::arange(numel, (Kind::Double, Device::Cpu)) * (r as f64 + 0.5))
        .view(shape)
        .cos()
        .set_requires_grad(true)
}

#[test]
#[ignore = "one rank of autograd_collectives_match_single_process_gradients"]
fn rank_autograd() {
    let Some(pg) = world("rank_autograd", TIMEOUT) else {
        return;
    };
    let (rank, n) = (pg.rank(), pg.size());

    // All-gather along dim 1 ([2, 3, 4] per rank -> [2, 3n, 4]), as context parallelism gathers
    // K/V along the sequence. Single process: every rank's output is the same concatenation of
    // all inputs, and the loss is the sum of every rank's loss.
    let shape = [2i64, 3, 4];
    let x = leaf(rank, &shape);
    let y = pg.all_gather_autograd(&x, 1).unwrap();
    let xs: Vec<Tensor> = (0..n).map(|r| leaf(r, &shape)).collect();
    let full = Tensor::cat(&xs, 1);
    assert!(same(&y, &full));
    let out_shape = [2i64, 3 * n as i64, 4];
    (&y * weight(rank, &out_shape))
        .sum(Kind::Double)
        .f_backward()
        .unwrap();
    let total: Tensor = (0..n)
        .map(|r| (&full * weight(r, &out_shape)).sum(Kind::Double))
        .sum();
    total.backward();
    assert!(
        same(&x.grad(), &xs[rank].grad()),
        "all_gather_autograd gradient"
    );

    // Reduce-scatter along dim -2 ([2, 2n, 3] per rank -> [2, 2, 3]).
    let shape = [2i64, 2 * n as i64, 3];
    let x = leaf(rank, &shape);
    let z = pg.reduce_scatter_autograd(&x, -2).unwrap();
    let xs: Vec<Tensor> = (0..n).map(|r| leaf(r, &shape)).collect();
    let sum: Tensor = xs.iter().sum();
    let parts = sum.chunk(n as i64, 1);
    assert!(same(&z, &parts[rank]));
    let w_shape = [2i64, 2, 3];
    (&z * weight(rank, &w_shape))
        .sum(Kind::Double)
        .f_backward()
        .unwrap();
    let total: Tensor = (0..n)
        .map(|r| (&parts[r] * weight(r, &w_shape)).sum(Kind::Double))
        .sum();
    total.backward();
    assert!(
        same(&x.grad(), &xs[rank].grad()),
        "reduce_scatter_autograd gradient"
    );

    // All-to-all of n blocks of [2, 3] ([2n, 3] per rank): block j of rank i lands as block i
    // on rank j. Single process: output of rank j = cat over i of block j of input i.
    let shape = [2 * n as i64, 3];
    let x = leaf(rank, &shape);
    let a = pg.all_to_all_autograd(&x).unwrap();
    let xs: Vec<Tensor> = (0..n).map(|r| leaf(r, &shape)).collect();
    let outs: Vec<Tensor> = (0..n)
        .map(|j| {
            Tensor::cat(
                &xs.iter()
                    .map(|x| x.narrow(0, 2 * j as i64, 2))
                    .collect::<Vec<_>>(),
                0,
            )
        })
        .collect();
    assert!(same(&a, &outs[rank]));
    (&a * weight(rank, &shape))
        .sum(Kind::Double)
        .f_backward()
        .unwrap();
    let total: Tensor = (0..n)
        .map(|r| (&outs[r] * weight(r, &shape)).sum(Kind::Double))
        .sum();
    total.backward();
    assert!(
        same(&x.grad(), &xs[rank].grad()),
        "all_to_all_autograd gradient"
    );
    pg.barrier().unwrap();
}

#[test]
fn subgroups_for_data_and_context_parallelism() {
    launch("rank_subgroups", 4);
}

#[test]
#[ignore = "one rank of subgroups_for_data_and_context_parallelism"]
fn rank_subgroups() {
    let Some(pg) = world("rank_subgroups", TIMEOUT) else {
        return;
    };
    let rank = pg.rank();
    // 2 (DP) x 2 (CP): CP groups are neighbours, DP groups stride by the CP size.
    let cp = pg.split(&[vec![0, 1], vec![2, 3]]).unwrap();
    let dp = pg.split(&[vec![0, 2], vec![1, 3]]).unwrap();
    assert_eq!((cp.rank(), cp.size()), (rank % 2, 2));
    assert_eq!((dp.rank(), dp.size()), (rank / 2, 2));
    assert_eq!(cp.world_ranks(), &[rank / 2 * 2, rank / 2 * 2 + 1]);
    assert_eq!(dp.world_ranks(), &[rank % 2, rank % 2 + 2]);

    let mut t = Tensor::from_slice(&[rank as f32]);
    cp.all_reduce(&mut t, ReduceOp::Sum).unwrap();
    assert_eq!(t.double_value(&[0]), (rank / 2 * 4 + 1) as f64);
    let g = dp.all_gather(&Tensor::from_slice(&[rank as i64])).unwrap();
    assert_eq!(
        Vec::<i64>::try_from(&g).unwrap(),
        vec![(rank % 2) as i64, (rank % 2 + 2) as i64]
    );

    // Non-members get None; a subgroup of a subgroup is made by its parent's members only.
    let odd = pg.new_subgroup(&[3, 1]).unwrap();
    assert_eq!(
        odd.as_ref().map(|g| g.world_ranks().to_vec()),
        (rank % 2 == 1).then(|| vec![1, 3])
    );
    let solo = cp.new_subgroup(&[1]).unwrap();
    if let Some(solo) = solo {
        assert_eq!((solo.size(), solo.world_ranks()), (1, &[rank][..]));
        let mut t = Tensor::from_slice(&[7.0f32]);
        solo.all_reduce(&mut t, ReduceOp::Sum).unwrap();
        assert_eq!(t.double_value(&[0]), 7.0);
    }
    assert!(matches!(
        pg.new_subgroup(&[0, 4]),
        Err(DistError::Input { .. })
    ));
    assert!(matches!(
        pg.new_subgroup(&[1, 1]),
        Err(DistError::Input { .. })
    ));
    pg.barrier().unwrap();
}

#[test]
fn a_silent_peer_times_out_and_a_dead_peer_fails_fast() {
    launch("rank_failures", 2);
}

#[test]
#[ignore = "one rank of a_silent_peer_times_out_and_a_dead_peer_fails_fast"]
fn rank_failures() {
    let Some(pg) = world("rank_failures", TIMEOUT) else {
        return;
    };
    let sub = pg.new_subgroup(&[0, 1]).unwrap().unwrap();
    if pg.rank() == 1 {
        // Silent until rank 0's first collective has timed out (it says so in the store), then
        // gone without a word.
        pg.store().get("timed out", TIMEOUT).unwrap();
        println!("{LEFT}");
        std::process::exit(0);
    }
    let short = Duration::from_millis(1000);
    pg.set_timeout(short);
    let start = Instant::now();
    let err = pg
        .all_reduce(
            &mut Tensor::ones([4], (Kind::Float, Device::Cpu)),
            ReduceOp::Sum,
        )
        .unwrap_err();
    let took = start.elapsed();
    pg.store().set("timed out", b"1").unwrap();
    assert!(
        matches!(
            err,
            DistError::Collective {
                op: "all_reduce",
                rank: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("all_reduce failed on rank 0 of 2"),
        "{err}"
    );
    // The lower bound holds on any machine; the upper one only tells the short timeout from the
    // group's (120 s), with room for a loaded machine.
    assert!(
        took >= short && took < short * 30,
        "timed out after {took:?}"
    );

    // The other group has a long timeout, but rank 1's exit closes its connections.
    let start = Instant::now();
    let err = sub.barrier().unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(
            err,
            DistError::Collective {
                op: "barrier",
                rank: 0,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        took < Duration::from_secs(8),
        "noticed the exit after {took:?}"
    );
    eprintln!("timeout: {err}");
}

/// Runs `f(rank)` for every rank on its own thread, and returns their results by rank.
fn threads<T: Send + 'static>(
    world: usize,
    f: impl Fn(usize) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = std::sync::Arc::new(f);
    let handles: Vec<_> = (0..world)
        .map(|r| {
            let f = f.clone();
            std::thread::spawn(move || f(r))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn a_world_of_one_needs_no_peers() {
    let pg = ProcessGroup::new(
        &Rendezvous::local(free_port(), 0, 1),
        Backend::Gloo,
        TIMEOUT,
    )
    .unwrap();
    let mut t = input(0, Kind::Float);
    pg.all_reduce(&mut t, ReduceOp::Avg).unwrap();
    assert!(same(&t, &input(0, Kind::Float)));
    assert!(same(&pg.all_gather(&t).unwrap(), &t));
    // Traffic: two calls, each handing over t's bytes.
    let stats = pg.stats();
    let bytes = (t.numel() * 4) as u64;
    assert_eq!((stats.calls, stats.bytes), (2, 2 * bytes));
    assert!(stats.seconds > 0.0);
    // A timeout for one call, then the group's again.
    let inner = pg.with_timeout(Duration::from_millis(1234), |g| g.timeout());
    assert_eq!(inner, Duration::from_millis(1234));
    assert_eq!(pg.timeout(), TIMEOUT);
    pg.store().set("run", b"abc").unwrap();
    assert_eq!(pg.store().get("run", TIMEOUT).unwrap(), b"abc");
    assert_eq!(pg.store().add("n", 2).unwrap(), 2);
}

#[test]
fn a_taken_port_is_named() {
    let holder = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let start = Instant::now();
    let err = ProcessGroup::new(
        &Rendezvous::local(port, 0, 2),
        Backend::Gloo,
        Duration::from_secs(3),
    )
    .unwrap_err();
    assert!(
        matches!(err, DistError::PortInUse { port: p, .. } if p == port),
        "{err}"
    );
    assert!(err.to_string().contains("MASTER_PORT"), "{err}");
    eprintln!("{err}");
    // A taken port fails the bind at once (milliseconds); 3 s only tells it from waiting out
    // the rendezvous timeout, with a wide margin for a loaded machine.
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn an_absent_master_is_reported_after_the_timeout() {
    let port = free_port();
    let start = Instant::now();
    let err = ProcessGroup::new(
        &Rendezvous::local(port, 1, 2),
        Backend::Gloo,
        Duration::from_millis(1500),
    )
    .unwrap_err();
    assert!(
        matches!(err, DistError::MasterUnreachable { rank: 1, .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    eprintln!("{err}");
    // The 1.5 s timeout plus connection attempts: 6 s is a 4x margin for a loaded machine.
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn ranks_that_disagree_on_the_world_size_all_fail() {
    let port = free_port();
    let results = threads(2, move |rank| {
        let mut r = Rendezvous::local(port, rank, 2);
        if rank == 1 {
            r.world_size = 3;
            r.local_world_size = 3;
        }
        ProcessGroup::new(&r, Backend::Gloo, Duration::from_secs(10))
            .err()
            .map(|e| e.to_string())
    });
    let want = "rank 1 has WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2";
    for (rank, e) in results.iter().enumerate() {
        let e = e.as_deref().unwrap_or("no error");
        assert!(e.contains(want), "rank {rank}: {e}");
        eprintln!("{e}");
    }
}

#[test]
fn a_rank_claimed_twice_fails_every_rank() {
    let port = free_port();
    let results = threads(3, move |i| {
        let r = Rendezvous::local(port, i.min(1), 3);
        ProcessGroup::new(&r, Backend::Gloo, Duration::from_secs(10))
            .err()
            .map(|e| e.to_string())
    });
    for (i, e) in results.iter().enumerate() {
        let e = e.as_deref().unwrap_or("no error");
        assert!(e.contains("RANK=1"), "process {i}: {e}");
    }
}

#[test]
fn a_missing_rank_is_a_timeout_naming_the_count() {
    let r = Rendezvous::local(free_port(), 0, 2);
    let err = ProcessGroup::new(&r, Backend::Gloo, Duration::from_millis(500)).unwrap_err();
    assert!(err.to_string().contains("1 of 2 ranks joined"), "{err}");
    eprintln!("{err}");
}

#[test]
fn nccl_needs_its_feature_and_a_gpu() {
    let r = Rendezvous::local(free_port(), 0, 1);
    let result = ProcessGroup::new(&r, Backend::Nccl, TIMEOUT);
    if !cfg!(feature = "nccl") {
        let err = result.unwrap_err();
        assert!(
            matches!(
                err,
                DistError::Unavailable {
                    backend: "nccl",
                    ..
                }
            ),
            "{err}"
        );
    } else if !tch::Cuda::is_available() {
        let err = result.unwrap_err();
        assert!(
            matches!(
                err,
                DistError::GroupCreate {
                    backend: "nccl",
                    ..
                }
            ),
            "{err}"
        );
        eprintln!("{err}");
    } else {
        // NCCL refuses two ranks on one GPU, so a world of one is what a single GPU can check.
        let pg = result.unwrap();
        let mut t = Tensor::arange(8, (Kind::Float, Device::Cuda(0)));
        pg.all_reduce(&mut t, ReduceOp::Avg).unwrap();
        assert!(same(
            &t.to(Device::Cpu),
            &Tensor::arange(8, (Kind::Float, Device::Cpu))
        ));
        let g = pg
            .all_gather_autograd(&t.set_requires_grad(true), 0)
            .unwrap();
        assert_eq!(g.size(), [8]);
        pg.barrier().unwrap();
    }
}

#[test]
fn a_mesh_splits_the_world_into_dp_by_cp() {
    launch("rank_mesh", 4);
}

#[test]
#[ignore = "one rank of a_mesh_splits_the_world_into_dp_by_cp"]
fn rank_mesh() {
    if std::env::var(ROLE_ENV).ok().as_deref() != Some("rank_mesh") {
        return;
    }
    let rdzv = Rendezvous::from_env().unwrap();
    let shape = MeshShape { dp: 0, cp: 2 };
    let mesh = Mesh::new(&rdzv, shape, Device::Cpu, TIMEOUT).unwrap();
    let rank = mesh.rank();
    assert_eq!(
        (mesh.world_size(), mesh.dp_size(), mesh.cp_size()),
        (4, 2, 2)
    );
    assert_eq!((mesh.dp_rank(), mesh.cp_rank()), (rank / 2, rank % 2));
    assert_eq!(mesh.backend(), Some(Backend::Gloo));
    let (cp, dp) = (mesh.cp_group().unwrap(), mesh.dp_group().unwrap());
    assert_eq!(cp.world_ranks(), &[rank / 2 * 2, rank / 2 * 2 + 1]);
    assert_eq!(dp.world_ranks(), &[rank % 2, rank % 2 + 2]);
    assert_eq!(cp.device(), Device::Cpu);
    // Traffic is summed over the mesh's groups: one all-reduce on each of the three.
    let before = mesh.comm_stats();
    for g in [mesh.world().unwrap(), dp, cp] {
        let mut t = Tensor::from_slice(&[1.0f64, 2.0]);
        g.all_reduce(&mut t, ReduceOp::Sum).unwrap();
        assert_eq!(t.double_value(&[1]), 2.0 * g.size() as f64);
    }
    let after = mesh.comm_stats();
    assert_eq!(
        (after.calls - before.calls, after.bytes - before.bytes),
        (3, 48)
    );
    mesh.world().unwrap().barrier().unwrap();
}

/// A group of one on the CPU (no peers needed).
fn solo() -> ProcessGroup {
    ProcessGroup::new(
        &Rendezvous::local(free_port(), 0, 1),
        Backend::Gloo,
        TIMEOUT,
    )
    .unwrap()
}

#[test]
fn collectives_take_strided_views_and_scalars_and_write_back() {
    launch("rank_strided", 2);
}

#[test]
#[ignore = "one rank of collectives_take_strided_views_and_scalars_and_write_back"]
fn rank_strided() {
    let Some(pg) = world("rank_strided", TIMEOUT) else {
        return;
    };
    let (rank, n) = (pg.rank() as i64, pg.size() as i64);
    // Rank r's base: arange(12) + 100·r as [3, 4]. The sum over ranks: n·arange + 100·Σr.
    let base_of = |r: i64, kind| {
        (Tensor::arange(12, (Kind::Int64, Device::Cpu)) + 100 * r)
            .to_kind(kind)
            .view([3, 4])
    };
    let offset = 100 * (0..n).sum::<i64>();
    for kind in [Kind::Float, Kind::Double, Kind::Int64] {
        // A transposed (non-contiguous) view: reduced through a dense copy, then written back
        // in place, so the base tensor holds the sum too.
        let base = base_of(rank, kind);
        let mut view = base.tr();
        assert!(!view.is_contiguous());
        pg.all_reduce(&mut view, ReduceOp::Sum).unwrap();
        let want = (Tensor::arange(12, (Kind::Int64, Device::Cpu)) * n + offset)
            .to_kind(kind)
            .view([3, 4]);
        assert!(
            same(&base, &want),
            "{kind:?} all_reduce into a strided view"
        );
        assert_eq!(view.kind(), kind);
        // Every other column of rank 1's base broadcast into rank 0's (and the rest kept).
        let base = base_of(rank, kind);
        let mut strided = base.slice(1, 0, 4, 2);
        assert!(!strided.is_contiguous());
        pg.broadcast(&mut strided, 1).unwrap();
        let from1 = base_of(1, kind);
        assert!(same(&base.slice(1, 0, 4, 2), &from1.slice(1, 0, 4, 2)));
        assert!(same(
            &base.slice(1, 1, 4, 2),
            &base_of(rank, kind).slice(1, 1, 4, 2)
        ));
    }
    // A 0-dim tensor keeps its shape.
    let mut s = Tensor::from(rank as f64 + 1.0);
    pg.all_reduce(&mut s, ReduceOp::Sum).unwrap();
    assert_eq!(s.dim(), 0);
    assert_eq!(s.double_value(&[]), (n * (n + 1) / 2) as f64);
    // Out-of-place collectives on strided input: dense results on the input's device.
    let t = base_of(rank, Kind::Double).tr();
    let g = pg.all_gather(&t).unwrap();
    let all: Vec<Tensor> = (0..n).map(|r| base_of(r, Kind::Double).tr()).collect();
    assert!(same(&g, &Tensor::cat(&all, 0)));
    assert_eq!(g.device(), Device::Cpu);
    let r = pg.reduce_scatter(&t, ReduceOp::Sum).unwrap();
    let sum: Tensor = all.iter().sum();
    assert!(same(&r, &sum.chunk(n, 0)[rank as usize]));
    let g0 = pg.all_gather(&Tensor::from(rank)).unwrap();
    assert_eq!(
        Vec::<i64>::try_from(&g0).unwrap(),
        (0..n).collect::<Vec<_>>()
    );
    // send/recv into a strided view.
    let base = Tensor::zeros([2, 4], (Kind::Double, Device::Cpu));
    if rank == 0 {
        pg.send(&base_of(0, Kind::Double).narrow(0, 0, 2).tr(), 1)
            .unwrap();
    } else {
        let mut view = base.tr();
        pg.recv(&mut view, 0).unwrap();
        assert!(same(&base, &base_of(0, Kind::Double).narrow(0, 0, 2)));
    }
    pg.barrier().unwrap();
}

#[test]
fn backward_collectives_are_counted_and_return_gradients_where_the_input_lives() {
    let pg = solo();
    let x = Tensor::arange(6, (Kind::Double, Device::Cpu))
        .view([2, 3])
        .set_requires_grad(true);
    let before = pg.stats();
    let y = pg.all_gather_autograd(&x, 1).unwrap();
    let forward = pg.stats();
    assert_eq!(
        (forward.calls - before.calls, forward.bytes - before.bytes),
        (1, 48)
    );
    (&y * 2.0).sum(Kind::Double).backward();
    let after = pg.stats();
    // The backward's reduce-scatter, counted by the shim: its payload is y's gradient.
    assert_eq!(
        (after.calls - forward.calls, after.bytes - forward.bytes),
        (1, 48)
    );
    let grad = x.grad();
    assert_eq!((grad.device(), grad.kind()), (Device::Cpu, Kind::Double));
    assert!(same(&grad, &(x.ones_like() * 2.0)));
    // The same for the other two.
    let z = pg.reduce_scatter_autograd(&x, 0).unwrap();
    let a = pg.all_to_all_autograd(&x).unwrap();
    (z.sum(Kind::Double) + a.sum(Kind::Double)).backward();
    let last = pg.stats();
    assert_eq!(
        (last.calls - after.calls, last.bytes - after.bytes),
        (4, 4 * 48)
    );
}

#[test]
fn groups_refuse_a_device_their_backend_cannot_use() {
    let r = Rendezvous::local(free_port(), 0, 1);
    let err = ProcessGroup::new_on(&r, Backend::Gloo, Device::Cuda(0), TIMEOUT).unwrap_err();
    assert!(matches!(err, DistError::Input { .. }), "{err}");
    let err = ProcessGroup::new_on(&r, Backend::Nccl, Device::Cpu, TIMEOUT).unwrap_err();
    assert!(matches!(err, DistError::Input { .. }), "{err}");
}

#[test]
fn a_mesh_on_cuda_without_nccl_is_refused_and_bad_layouts_name_the_flags() {
    let r = Rendezvous::local(free_port(), 0, 2);
    let shape = MeshShape { dp: 0, cp: 1 };
    if !cfg!(feature = "nccl") {
        // Refused before anything connects (no peer is running).
        let err = Mesh::new(&r, shape, Device::Cuda(0), TIMEOUT).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(
                err,
                DistError::Unavailable {
                    backend: "nccl",
                    ..
                }
            ),
            "{text}"
        );
        assert!(text.contains("--features nccl"), "{text}");
    }
    let err = Mesh::new(&r, MeshShape { dp: 3, cp: 1 }, Device::Cpu, TIMEOUT).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, DistError::Layout { .. }), "{text}");
    assert!(
        text.contains("--dp 3") && text.contains("--nproc"),
        "{text}"
    );
    let err = Mesh::new(&r, MeshShape { dp: 0, cp: 4 }, Device::Cpu, TIMEOUT).unwrap_err();
    assert!(err.to_string().contains("--cp 4"), "{err}");
    // One process: no groups, whatever the device.
    let one = Mesh::single(Device::Cpu);
    assert_eq!((one.world_size(), one.dp_size(), one.cp_size()), (1, 1, 1));
}

#[test]
fn a_failure_one_rank_announces_ends_a_rank_waiting_in_a_collective() {
    launch("rank_failure_watch", 2);
}

#[test]
#[ignore = "one rank of a_failure_one_rank_announces_ends_a_rank_waiting_in_a_collective"]
fn rank_failure_watch() {
    // The collective's own timeout is far beyond the test's patience: only the watch ends it.
    let Some(pg) = world("rank_failure_watch", Duration::from_secs(300)) else {
        return;
    };
    let rdzv = Rendezvous::from_env().unwrap();
    let watch = FailureWatch::start(&rdzv, watch_times(100, TIMEOUT), move |f| {
        assert_eq!(
            (f.rank, f.message.as_str()),
            (1, "out of memory\nin its forward")
        );
        // Rank 0, stuck in its all-reduce, leaves here; had the watch not heard, rank 1's
        // exit after its 10 s would have ended the all-reduce, and the panic below the test.
        println!("{LEFT}");
        rsd_dist::exit_now(0);
    })
    .unwrap();
    if pg.rank() == 1 {
        // Fails, and stays alive with its connections open (as an NCCL peer's failure would
        // look to rank 0) well past the time rank 0 needs to hear of it; its own watch ignores
        // its own announcement.
        watch
            .announcer()
            .announce("out of memory\nin its forward")
            .unwrap();
        std::thread::sleep(Duration::from_secs(10));
        println!("{LEFT}");
        rsd_dist::exit_now(0);
    }
    let result = pg.all_reduce(
        &mut Tensor::ones([4], (Kind::Float, Device::Cpu)),
        ReduceOp::Sum,
    );
    panic!("rank 0's all-reduce returned ({result:?}) before the watch ended the rank");
}

#[test]
fn rank_0s_failure_is_read_by_the_others_before_its_store_goes() {
    launch("rank_0_fails", 2);
}

#[test]
#[ignore = "one rank of rank_0s_failure_is_read_by_the_others_before_its_store_goes"]
fn rank_0_fails() {
    let Some(pg) = world("rank_0_fails", Duration::from_secs(300)) else {
        return;
    };
    let rdzv = Rendezvous::from_env().unwrap();
    let watch = FailureWatch::start(&rdzv, watch_times(500, TIMEOUT), move |f| {
        assert_eq!((f.rank, f.message.as_str()), (0, "disk full"));
        println!("{LEFT}");
        rsd_dist::exit_now(0);
    })
    .unwrap();
    if pg.rank() == 0 {
        // Rank 0's process hosts the store: it leaves as soon as its announcement returns,
        // which must be after rank 1 has read it.
        watch.announcer().announce("disk full").unwrap();
        println!("{LEFT}");
        rsd_dist::exit_now(0);
    }
    // Rank 1 waits where no socket of rank 0's would wake it (as in an NCCL collective).
    std::thread::sleep(Duration::from_secs(15));
    panic!("rank 1 never heard of rank 0's failure");
}

/// A watch's times for these tests: polls every `poll_ms`, a grace of 200 ms.
fn watch_times(poll_ms: u64, liveness: Duration) -> WatchTimes {
    WatchTimes {
        poll: Duration::from_millis(poll_ms),
        grace: Duration::from_millis(200),
        liveness,
    }
}

/// Where rank `rank` of the launch on this rendezvous port leaves its process id, so that a peer
/// can wake it after it froze itself.
fn pid_file(rank: usize) -> std::path::PathBuf {
    let port = std::env::var("MASTER_PORT").unwrap();
    std::env::temp_dir().join(format!("rsd-gloo-frozen-{port}-{rank}"))
}

/// Freezes this process (SIGSTOP: its sockets stay open and nothing it runs answers, as a hung
/// or swapped-out node looks to its peers) until a peer sends it SIGCONT, or a waker does after
/// 60 s (so that a watch that never fires fails the test instead of hanging it: the peer's
/// collective then sees this rank's exit); then it leaves.
fn freeze_until_woken(rank: usize) -> ! {
    let pid = std::process::id();
    // The waker runs in the background of a shell that prints its pid and exits; it has none of
    // this rank's pipes, which the launch reads to their end.
    let shell = std::process::Command::new("sh")
        .args([
            "-c",
            &format!("(sleep 60; kill -CONT {pid}) >/dev/null 2>&1 </dev/null & echo $!"),
        ])
        .output()
        .unwrap();
    let waker = String::from_utf8(shell.stdout).unwrap();
    std::fs::write(pid_file(rank), format!("{pid} {}", waker.trim())).unwrap();
    // SAFETY: raise has no preconditions.
    unsafe { libc::raise(libc::SIGSTOP) };
    println!("{LEFT}");
    rsd_dist::exit_now(0)
}

/// Wakes the frozen rank `rank` (so that the launch can end), stops its waker and removes its
/// pid file.
fn wake(rank: usize) {
    let text = std::fs::read_to_string(pid_file(rank)).unwrap();
    let pids: Vec<i32> = text.split(' ').map(|p| p.parse().unwrap()).collect();
    let _ = std::fs::remove_file(pid_file(rank));
    // SAFETY: kill has no preconditions.
    unsafe {
        libc::kill(pids[1], libc::SIGKILL);
        libc::kill(pids[0], libc::SIGCONT);
    }
}

/// Rank `frozen` of the launch `role` freezes itself half a second after its watch starts (it
/// has beaten by then) while the other waits for it in an all-reduce; the other's watch must
/// name it, with a message starting `how`, after the 2 s liveness period and long before the
/// collective's own timeout. The checks run after waking the frozen rank: a panic on the watch's
/// thread would leave the main thread waiting in its collective.
fn one_rank_freezes(role: &str, frozen: usize, how: &'static str) {
    let Some(pg) = world(role, Duration::from_secs(120)) else {
        return;
    };
    let rdzv = Rendezvous::from_env().unwrap();
    let started = Instant::now();
    let _watch = FailureWatch::start(&rdzv, watch_times(100, Duration::from_secs(2)), move |f| {
        let waited = started.elapsed();
        wake(frozen);
        let ok = f.rank == frozen
            && f.message.starts_with(how)
            && waited >= Duration::from_secs(2)
            && waited < Duration::from_secs(30);
        if !ok {
            eprintln!("{f:?} after {waited:?}");
            rsd_dist::exit_now(1);
        }
        println!("{LEFT}");
        rsd_dist::exit_now(0);
    })
    .unwrap();
    if pg.rank() == frozen {
        std::thread::sleep(Duration::from_millis(500));
        freeze_until_woken(frozen);
    }
    let result = pg.all_reduce(
        &mut Tensor::ones([4], (Kind::Float, Device::Cpu)),
        ReduceOp::Sum,
    );
    panic!("the all-reduce returned ({result:?}) before the watch ended the rank");
}

#[test]
fn a_rank_that_falls_silent_is_announced_by_rank_0_and_ends_it() {
    launch("rank_falls_silent", 2);
}

#[test]
#[ignore = "one rank of a_rank_that_falls_silent_is_announced_by_rank_0_and_ends_it"]
fn rank_falls_silent() {
    one_rank_freezes("rank_falls_silent", 1, "stopped answering: its heartbeat");
}

#[test]
fn a_frozen_rank_0_is_found_by_its_store_not_answering() {
    launch("rank_0_freezes", 2);
}

#[test]
#[ignore = "one rank of a_frozen_rank_0_is_found_by_its_store_not_answering"]
fn rank_0_freezes() {
    // Rank 0's process hosts the store: freezing it freezes the store too.
    one_rank_freezes(
        "rank_0_freezes",
        0,
        "stopped answering: the rendezvous store",
    );
}

#[test]
fn rank_0_keeps_the_store_up_until_every_rank_has_left() {
    launch("ranks_leave_apart", 2);
}

#[test]
#[ignore = "one rank of rank_0_keeps_the_store_up_until_every_rank_has_left"]
fn ranks_leave_apart() {
    let Some(pg) = world("ranks_leave_apart", TIMEOUT) else {
        return;
    };
    let rdzv = Rendezvous::from_env().unwrap();
    // Either rank taking the other's end for a failure fails the test.
    let watch = FailureWatch::start(&rdzv, watch_times(100, Duration::from_secs(2)), |f| {
        eprintln!("a normal end was taken for a failure: {f:?}");
        rsd_dist::exit_now(3);
    })
    .unwrap();
    pg.all_reduce(
        &mut Tensor::ones([4], (Kind::Float, Device::Cpu)),
        ReduceOp::Sum,
    )
    .unwrap();
    if pg.rank() == 1 {
        // Still finishing (writing a file, say) well past the liveness period, its watch
        // running: rank 0's store must still be there when it leaves.
        std::thread::sleep(Duration::from_secs(4));
        pg.store().set("rank 1 leaves", b"1").unwrap();
        watch.leave();
        return;
    }
    watch.leave();
    // Rank 0's leave returned only once rank 1 had left: its mark, set just before, is there.
    assert!(
        pg.store().check("rank 1 leaves").unwrap(),
        "rank 0 left before rank 1"
    );
}
