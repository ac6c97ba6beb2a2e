//! Memory measured on this machine (`rsd-train memory --measure STEPS`): a few real training
//! steps of the config, on CPU with libtorch's CPU allocator counted, on a CUDA device with the
//! caching allocator's own statistics ([`rsd_model::alloc`]), cut into the categories of the
//! plan ([`crate::memory_plan`]) by phase marks the trainer sets ([`mark`]):
//!
//! * `Model` (the model built, `Trainer::new`): the weights are the bytes live then;
//! * `Optimizer` (its state made): the optimizer state is what that added;
//! * `Forward` (the end of a micro-batch's forward, `step::step_micro`): the saved
//!   activations are what the step holds then above its start;
//! * `Backward` (every micro-batch's backward done): the transient is the peak between the step's
//!   start and this mark above the saved activations;
//! * `Reduced` (the gradients summed over the ranks): the communication buffers are the peak of
//!   that phase above its start;
//! * `Updated` (the update applied, the gradients zeroed): the optimizer update's working set
//!   likewise; this mark is also the next step's start.
//!
//! The first step is a warm-up and not measured: it allocates the parameters' gradients, which
//! later steps keep (zeroed). The gradients are what the step starts with above the model and
//! the optimizer state: what the earlier steps left behind.
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// A point of the run where the live bytes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The model is built (and its parameters broadcast).
    Model,
    /// The optimizer's state is made.
    Optimizer,
    /// One micro-batch's forward is done (its loss and backward not begun).
    Forward,
    /// Every micro-batch of the step is through its backward.
    Backward,
    /// The gradients are summed over the ranks.
    Reduced,
    /// The update is applied and the gradients zeroed: the step is over.
    Updated,
}

/// The live bytes at a mark, and the peak since the mark before.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Mark {
    /// Where.
    pub phase: Phase,
    /// Bytes live at the mark.
    pub live: u64,
    /// The most bytes live between the previous mark and this one.
    pub peak: u64,
    /// On CUDA, the most bytes the caching allocator held from the driver between the previous
    /// mark and this one (live tensors plus its cache); 0 on CPU.
    #[serde(default)]
    pub reserved: u64,
}

static ON: AtomicBool = AtomicBool::new(false);
/// The CUDA device whose allocator the marks read; -1: libtorch's CPU allocator.
static CUDA_DEVICE: AtomicI64 = AtomicI64::new(-1);
static MARKS: Mutex<Vec<Mark>> = Mutex::new(Vec::new());

/// Starts recording marks of `device`'s memory. On CPU this installs the counting allocator:
/// call it before any tensor to be counted exists. `false` when that allocator cannot be
/// counted, or `device` is a CUDA device libtorch does not see.
pub fn start(device: tch::Device) -> bool {
    match device {
        tch::Device::Cuda(i) => {
            if !tch::Cuda::is_available() || i >= tch::Cuda::device_count() as usize {
                return false;
            }
            // Fails while CUDA is not initialised yet; then no peak exists to restart.
            rsd_model::alloc::cuda_reset_peak(i);
            CUDA_DEVICE.store(i as i64, Ordering::SeqCst);
        }
        _ => {
            if !rsd_model::alloc::install() {
                return false;
            }
            rsd_model::alloc::reset_peak();
            CUDA_DEVICE.store(-1, Ordering::SeqCst);
        }
    }
    if let Ok(mut m) = MARKS.lock() {
        m.clear();
    }
    ON.store(true, Ordering::SeqCst);
    true
}

/// Records a mark when measuring ([`start`]); nothing otherwise (one atomic load).
pub fn mark(phase: Phase) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    let device = CUDA_DEVICE.load(Ordering::Relaxed);
    let mark = if device < 0 {
        let peak = rsd_model::alloc::reset_peak();
        let live = rsd_model::alloc::live_bytes();
        Mark {
            phase,
            live,
            peak,
            reserved: 0,
        }
    } else {
        // The caching allocator counts on the host as tensors are made and dropped: no device
        // synchronisation is needed for the counts to be those of the work issued so far.
        let device = device as usize;
        let Some(m) = rsd_model::alloc::cuda_memory(device) else {
            return;
        };
        rsd_model::alloc::cuda_reset_peak(device);
        Mark {
            phase,
            live: m.allocated,
            peak: m.peak_allocated,
            reserved: m.peak_reserved,
        }
    };
    if let Ok(mut m) = MARKS.lock() {
        m.push(mark);
    }
}

/// Where the marks are read: `cpu`, or `cuda:N`.
pub fn marks_device() -> String {
    match CUDA_DEVICE.load(Ordering::Relaxed) {
        d if d < 0 => "cpu".into(),
        d => format!("cuda:{d}"),
    }
}

/// The marks recorded so far.
pub fn marks() -> Vec<Mark> {
    MARKS.lock().map(|m| m.clone()).unwrap_or_default()
}

/// What one rank measured, bytes, by the plan's categories.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Measured {
    /// Live after the model was built.
    pub weights: u64,
    /// Kept from one step to the next above the model and the optimizer state.
    pub gradients: u64,
    /// Added by making the optimizer.
    pub optimizer_state: u64,
    /// Held at the end of the forward above the step's start (largest micro-batch).
    pub saved_activations: u64,
    /// The peak of forward and backward above the step's start and the saved activations.
    pub transient: u64,
    /// The peak of the gradient reduction above its start.
    pub communication: u64,
    /// The peak of the update above its start.
    pub optimizer_update: u64,
    /// The most bytes live during the measured steps.
    pub peak: u64,
    /// The most bytes live from the model's build on, warm-up step included.
    pub peak_all: u64,
    /// The process's peak resident set (everything, not only tensors).
    pub peak_rss: u64,
    /// On CUDA, the most bytes the caching allocator took from the driver (tensors and its
    /// cache), warm-up step included: what `nvidia-smi` shows less the CUDA context and the
    /// libraries' workspaces. 0 on CPU.
    #[serde(default)]
    pub peak_reserved: u64,
    /// Where it was measured: `cpu` or `cuda:N`.
    #[serde(default)]
    pub device: String,
    /// The rank.
    pub rank: usize,
}

/// Cuts a rank's marks into categories (see the module docs). `None` when the marks do not
/// describe a model, an optimizer and at least two steps.
pub fn categorize(marks: &[Mark]) -> Option<Measured> {
    let model = marks.iter().position(|m| m.phase == Phase::Model)?;
    let opt = model
        + marks[model..]
            .iter()
            .position(|m| m.phase == Phase::Optimizer)?;
    let ends: Vec<usize> = (opt..marks.len())
        .filter(|&i| marks[i].phase == Phase::Updated)
        .collect();
    if ends.len() < 2 {
        return None;
    }
    let mut out = Measured {
        weights: marks[model].live,
        optimizer_state: marks[opt].live.saturating_sub(marks[model].live),
        peak_all: marks[model + 1..].iter().map(|m| m.peak).max().unwrap_or(0),
        peak_reserved: marks.iter().map(|m| m.reserved).max().unwrap_or(0),
        ..Measured::default()
    };
    // Every step after the warm-up: from the previous step's end to this one's.
    for w in ends.windows(2) {
        let (start, end) = (w[0], w[1]);
        let base = marks[start].live;
        let step = &marks[start + 1..=end];
        let backward = start + 1 + step.iter().position(|m| m.phase == Phase::Backward)?;
        let reduced = start + 1 + step.iter().position(|m| m.phase == Phase::Reduced)?;
        let saved = marks[start + 1..backward]
            .iter()
            .filter(|m| m.phase == Phase::Forward)
            .map(|m| m.live.saturating_sub(base))
            .max()
            .unwrap_or(0);
        let fb_peak = marks[start + 1..=backward]
            .iter()
            .map(|m| m.peak)
            .max()
            .unwrap_or(0);
        let comm_peak = marks[backward + 1..=reduced]
            .iter()
            .map(|m| m.peak)
            .max()
            .unwrap_or(0);
        let update_peak = marks[reduced + 1..=end]
            .iter()
            .map(|m| m.peak)
            .max()
            .unwrap_or(0);
        let g = base.saturating_sub(marks[opt].live);
        out.gradients = out.gradients.max(g);
        out.saved_activations = out.saved_activations.max(saved);
        out.transient = out.transient.max(fb_peak.saturating_sub(base + saved));
        out.communication = out
            .communication
            .max(comm_peak.saturating_sub(marks[backward].live));
        out.optimizer_update = out
            .optimizer_update
            .max(update_peak.saturating_sub(marks[reduced].live));
        out.peak = out.peak.max(fb_peak.max(comm_peak).max(update_peak));
    }
    Some(out)
}

/// The largest of the ranks' values, per category (the rank that needs the most memory decides).
pub fn worst(ranks: &[Measured]) -> Measured {
    let mut out = Measured::default();
    for m in ranks {
        out.weights = out.weights.max(m.weights);
        out.gradients = out.gradients.max(m.gradients);
        out.optimizer_state = out.optimizer_state.max(m.optimizer_state);
        out.saved_activations = out.saved_activations.max(m.saved_activations);
        out.transient = out.transient.max(m.transient);
        out.communication = out.communication.max(m.communication);
        out.optimizer_update = out.optimizer_update.max(m.optimizer_update);
        out.peak = out.peak.max(m.peak);
        out.peak_all = out.peak_all.max(m.peak_all);
        out.peak_rss = out.peak_rss.max(m.peak_rss);
        out.peak_reserved = out.peak_reserved.max(m.peak_reserved);
        if out.device.is_empty() {
            out.device = m.device.clone();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(phase: Phase, live: u64, peak: u64) -> Mark {
        Mark {
            phase,
            live,
            peak,
            reserved: peak + 7,
        }
    }

    #[test]
    fn marks_are_cut_into_categories() {
        use Phase::*;
        let marks = [
            m(Model, 100, 120),
            m(Optimizer, 400, 410),
            // warm-up step: gradients (50) appear
            m(Forward, 480, 480),
            m(Backward, 450, 600),
            m(Reduced, 450, 470),
            m(Updated, 450, 500),
            // measured step
            m(Forward, 530, 530),
            m(Backward, 452, 620),
            m(Reduced, 452, 490),
            m(Updated, 450, 475),
        ];
        let c = categorize(&marks).unwrap();
        assert_eq!(c.weights, 100);
        assert_eq!(c.optimizer_state, 300);
        assert_eq!(c.gradients, 50);
        assert_eq!(c.saved_activations, 80);
        assert_eq!(c.transient, 620 - 530);
        assert_eq!(c.communication, 490 - 452);
        assert_eq!(c.optimizer_update, 475 - 452);
        assert_eq!(c.peak, 620);
        assert_eq!(c.peak_all, 620);
        assert_eq!(c.peak_reserved, 627, "the most reserved, warm-up included");
        assert!(categorize(&marks[..6]).is_none(), "a warm-up step alone");
    }
}
