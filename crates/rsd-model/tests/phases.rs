//! The phase clock (`rsd_model::phases`): spans nest by path, sum per path, cover their work, and
//! a span left open is an error.
use rsd_model::phases::{enable, take, timed, Phase};
use rsd_model::{attend, KvBlock, Mask};
use tch::{Device, Kind, Tensor};

/// The clock is process-wide: this file is its own test process, and its checks run in one
/// test, in order, so no other test's attention calls record into it.
#[test]
fn spans_nest_sum_by_path_and_cover_their_work() {
    // Off: spans record nothing.
    drop(Phase::begin("ignored"));
    assert!(take().unwrap().is_empty());

    enable(Device::Cpu).unwrap();
    let sleep = |ms| std::thread::sleep(std::time::Duration::from_millis(ms));
    {
        let _step = Phase::begin("forward");
        sleep(20);
        for _ in 0..2 {
            timed("attention forward", || sleep(15));
        }
    }
    timed("optimizer", || sleep(5));
    let got = take().unwrap();
    let paths: Vec<&str> = got.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(paths, ["forward", "forward/attention forward", "optimizer"]);
    let (fwd, attn, opt) = (&got[0], &got[1], &got[2]);
    assert_eq!((fwd.count, attn.count, opt.count), (1, 2, 1));
    // Sleeps are lower bounds; the outer span holds the inner ones.
    assert!(attn.seconds >= 0.030, "{attn:?}");
    assert!(fwd.seconds >= 0.020 + attn.seconds, "{fwd:?} vs {attn:?}");
    assert!(opt.seconds >= 0.005 && opt.seconds < fwd.seconds, "{opt:?}");
    // Taken: the next step starts empty.
    assert!(take().unwrap().is_empty());

    // A span left open is an error that names it, and the clock starts afresh after it.
    let open = Phase::begin("loss");
    let err = take().unwrap_err().to_string();
    assert!(err.contains("still open") && err.contains("loss"), "{err}");
    drop(open);
    assert!(take().unwrap().is_empty());

    // The attention function's own spans, forward and backward, nest under the open phase.
    // On the CPU a causal GQA block runs once per query group (2 here).
    let leaf = |h| Tensor::randn([1, h, 8, 16], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let (q, k, v) = (leaf(4), leaf(2), leaf(2));
    let block = [KvBlock {
        k: &k,
        v: &v,
        mask: Mask::Causal,
    }];
    let out = timed("forward", || attend(&q, &block, 0.25).unwrap().out);
    timed("backward", || out.sum(Kind::Float).backward());
    let got = take().unwrap();
    let count = |path: &str| got.iter().find(|p| p.path == path).map(|p| p.count);
    assert_eq!(count("forward/attention forward"), Some(2), "{got:?}");
    assert_eq!(count("backward/attention backward"), Some(2), "{got:?}");

    // CUDA device indices that libtorch cannot use are refused with the reason.
    if tch::Cuda::device_count() == 0 {
        assert!(enable(Device::Cuda(0)).is_err());
    }
}
