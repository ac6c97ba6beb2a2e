//! The counting CPU allocator, alone in its own test binary: its counters are process-wide, so
//! no other test may allocate tensors on a parallel thread while this one counts.

use rsd_model::alloc::{allocations, install, live_bytes, peak_bytes, reset_peak};
use tch::{Kind, Tensor};

#[test]
fn counts_storages_exactly_and_the_peak_resets() {
    assert!(install());
    assert!(
        install(),
        "a second install is a no-op that still reports counting"
    );
    let before = live_bytes();
    let n = 3 * 1024 * 1024 + 7;
    let t = Tensor::zeros([n], (Kind::Float, tch::Device::Cpu));
    assert_eq!(live_bytes() - before, 4 * n as u64);
    // A view shares the storage: nothing new.
    let v = t.narrow(0, 10, 100);
    assert_eq!(live_bytes() - before, 4 * n as u64);
    drop(t);
    assert_eq!(
        live_bytes() - before,
        4 * n as u64,
        "the view keeps the storage"
    );
    drop(v);
    assert_eq!(live_bytes(), before);
    assert!(peak_bytes() >= before + 4 * n as u64);
    let old = reset_peak();
    assert!(old >= before + 4 * n as u64);
    assert_eq!(peak_bytes(), live_bytes());
    // bf16: 2 bytes a value; a temporary inside an op raises the peak, not the live bytes.
    let a = Tensor::ones([1000, 1000], (Kind::BFloat16, tch::Device::Cpu));
    let live = live_bytes();
    assert_eq!(live - before, 2_000_000);
    let s = (&a * 2.0 + 1.0).sum(Kind::Float);
    assert_eq!(s.double_value(&[]), 3_000_000.0);
    assert!(
        peak_bytes() >= live + 2_000_000,
        "the product's temporary counts at the peak"
    );
    drop(a);
    drop(s);
    assert_eq!(live_bytes(), before);
    // Storages resized in place are counted at their new size.
    let mut r = Tensor::zeros([10], (Kind::Float, tch::Device::Cpu));
    let _ = r.resize_([1 << 20]);
    assert_eq!(live_bytes() - before, 4 << 20);
    drop(r);
    assert_eq!(live_bytes(), before);
    assert!(allocations() > 0);
}
