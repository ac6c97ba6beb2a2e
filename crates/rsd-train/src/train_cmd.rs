//! `rsd-train` (train): resolves the run (fresh or resumed), starts the ranks a layout needs,
//! trains, and prints what was done.
use std::path::{Path, PathBuf};

use anyhow::Result;

use rsd_train::config::{Stated, TrainConfig};
use rsd_train::job_end::JobEnd;
use rsd_train::resume::{self, Run};
use rsd_train::run_dir;
use rsd_train::step::{prefix_reuse_floor, Objective};
use rsd_train::train::{Start, Summary, Trainer};

use crate::args::TrainArgs;
use crate::{launch, memory_cmd, signals};

/// The dp × cp layout the config asks for (dp 0: whatever the world size leaves).
fn mesh_shape(cfg: &TrainConfig) -> rsd_dist::MeshShape {
    rsd_dist::MeshShape {
        dp: cfg.dp,
        cp: cfg.cp.max(1),
    }
}

/// The objective as the config and the command line write it (`rsd`, `two-view-clm`, …).
fn objective_name(objective: Objective) -> String {
    serde_json::to_value(objective)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Whether this process prints start-up notes (rank 0, or not data-parallel).
fn is_rank0() -> bool {
    std::env::var("RANK").map_or(true, |r| r.trim() == "0")
}

/// A hint for errors whose cause is a full disk: what was kept, and how to go on.
fn disk_full_hint(e: &anyhow::Error, out: &Path) -> Option<String> {
    let full = e.chain().any(|c| {
        let io = match c.downcast_ref::<rsd_train::Error>() {
            Some(rsd_train::Error::Io { source, .. }) => Some(source),
            _ => c.downcast_ref::<std::io::Error>(),
        };
        // libtorch's and the safetensors crate's writers report the OS error only as text.
        io.is_some_and(|io| io.kind() == std::io::ErrorKind::StorageFull)
            || c.to_string().contains("No space left on device")
    });
    if !full {
        return None;
    }
    let kept = rsd_train::checkpoint::list(out)
        .pop()
        .map_or("none yet".to_string(), |(_, p)| p.display().to_string());
    Some(format!(
        "the disk is full; the unfinished checkpoint was removed and the last complete one is \
         {kept}: free space, then run the same command with --resume auto"
    ))
}

/// A loss for the final line: the number, or `n/a` when no step ran.
fn loss_str(loss: Option<f64>) -> String {
    loss.map_or_else(|| "n/a".to_string(), |l| format!("{l:.4}"))
}

/// Set for the ranks `--nproc` starts: the launching process has printed how the run was
/// resolved, so they do not print it again.
const NOTES_SHOWN: &str = "RSD_TRAIN_NOTES_SHOWN";

/// `rsd-train` and `rsd-train train`.
pub fn run(a: TrainArgs) -> Result<()> {
    // First, so that a signal while the run directory's lock is awaited or the directory is
    // prepared stops the run rather than killing the process (SIGUSR1's default action).
    let stop = signals::install()?;
    let stated = Stated::read(a.config.as_deref(), a.overrides.clone())?;
    let mut notes = Vec::new();
    let resolved = resume::resolve_run(stated, a.resume.as_deref(), &a.allow_change, &mut notes);
    let Run {
        config: cfg,
        checkpoint: resume,
    } = match resolved {
        Ok(run) => run,
        Err(e) => {
            // What was found before the error (damaged checkpoints, say) explains it.
            for n in &notes {
                eprintln!("{n}");
            }
            return Err(e.into());
        }
    };
    if a.print_config {
        for n in &notes {
            eprintln!("{n}");
        }
        print!("{}", cfg.to_toml());
        return Ok(());
    }
    if let Some(arch) = &a.print_memory_plan {
        let arch = (!arch.is_empty()).then(|| PathBuf::from(arch));
        return memory_cmd::print_plan(&cfg, arch.as_deref(), a.ranks.nproc, a.gpu_gib);
    }
    // A CUDA run whose plan does not fit its GPUs stops here, naming the change that fits.
    memory_cmd::refuse_if_too_big(&cfg, a.ranks.nproc, a.gpu_gib)?;
    let nproc = ranks_to_start(&cfg, a.ranks.nproc)?;
    if is_rank0() && std::env::var_os(NOTES_SHOWN).is_none() {
        for n in &notes {
            eprintln!("{n}");
        }
    }
    if let Some(n) = nproc {
        // SAFETY (set_var): no other thread runs yet; the ranks inherit the environment.
        std::env::set_var(NOTES_SHOWN, "1");
        match launch::run(n)? {
            0 => return Ok(()),
            code => std::process::exit(code),
        }
    }
    let out = PathBuf::from(&cfg.out);
    let _lock = take_run_dir(&out, resume.as_deref(), &a)?;
    stop_if_signalled_before_the_first_step(&stop, resume.as_deref());
    let mut trainer = Trainer::new(
        cfg.clone(),
        Start {
            resume: resume.as_deref(),
            fall_back: a.resume.as_deref() == Some("auto"),
            on_failure: Some(Box::new(stop_on_another_ranks_failure)),
        },
    )?;
    announce_panics(&trainer);
    // Rank 0's clock decides for every rank (one reader of the job record per job).
    if let Some(end) = trainer.is_main().then(JobEnd::of_slurm_job).flatten() {
        trainer.stop_before(end);
    }
    let main = trainer.is_main();
    if main {
        print_start(&trainer, &cfg, &out);
    }
    let summary = trainer.run(stop.flag()).map_err(|e| {
        let e = anyhow::Error::from(e);
        match disk_full_hint(&e, &out) {
            Some(hint) => e.context(hint),
            None => e,
        }
    })?;
    end_of_run(&summary, main, &stop)
}

/// Takes the run directory: its lock (rank 0, held until the returned guard drops), taken before
/// anything under `out` is cleaned up or written; then the unfinished checkpoints a writer killed
/// mid-checkpoint left (only the holder removes them), and the directory's preparation.
fn take_run_dir(
    out: &Path,
    resume: Option<&Path>,
    a: &TrainArgs,
) -> Result<Option<run_dir::RunLock>> {
    let lock = run_dir::RunLock::for_rank0(out, is_rank0())?;
    if let Some(lock) = &lock {
        for dir in run_dir::remove_stale_temporaries(out, lock) {
            eprintln!("rsd-train: removed unfinished checkpoint {}", dir.display());
        }
    }
    run_dir::prepare(out, resume, a.resume.as_deref(), a.overwrite, is_rank0())?;
    Ok(lock)
}

/// A signal that came before the first step (while the lock was awaited, say) ends the process
/// here: the run is where its newest checkpoint (or its start) left it, so nothing is lost.
fn stop_if_signalled_before_the_first_step(stop: &signals::Stop, resume: Option<&Path>) {
    let Some(code) = stop.exit_status() else {
        return;
    };
    if is_rank0() {
        eprintln!(
            "rsd-train: stopped before the first step; nothing to save: {} (exit status {code})",
            resume.map_or_else(
                || "the run starts afresh with --resume auto".to_string(),
                |c| format!("the run continues from {} with --resume auto", c.display())
            )
        );
    }
    std::process::exit(code);
}

/// What a run that ended without an error prints (rank 0) and the status it exits with: 0, or,
/// when a signal or the job's end time stopped it early with its state in a checkpoint, the
/// signal's status (75, or 130 after Ctrl-C), so that a job script can requeue it. The signal may
/// have reached another rank only: every rank exits as it would. A run that reached its end
/// exits 0 whatever arrived meanwhile; a stopped run whose state no checkpoint holds (it saves
/// nothing: `save_at_end = false` without `save_every`) exits 1, saying so.
fn end_of_run(summary: &Summary, main: bool, stop: &signals::Stop) -> Result<()> {
    let stopped = summary
        .signalled
        .then(|| stop.exit_status().unwrap_or(signals::EXIT_STOPPED));
    let kept = summary.checkpointed;
    if main {
        print_done(summary)?;
        match stopped {
            Some(code) if kept => eprintln!(
                "rsd-train: stopped {} at step {} with a checkpoint ({}); run the same command \
                 with --resume auto to continue (exit status {code})",
                if summary.out_of_time {
                    "before the job's end time"
                } else {
                    "on a signal"
                },
                summary.steps,
                summary
                    .checkpoint
                    .as_deref()
                    .map_or(String::new(), |p| p.display().to_string())
            ),
            Some(_) => eprintln!(
                "rsd-train: stopped at step {} without a checkpoint of it (this run writes none: \
                 save_at_end = false and no save_every); --resume auto continues from {}",
                summary.steps,
                summary
                    .checkpoint
                    .as_deref()
                    .map_or("the start".to_string(), |p| p.display().to_string())
            ),
            None => {}
        }
    }
    match stopped {
        Some(code) if kept => std::process::exit(code),
        Some(_) => std::process::exit(1),
        None => Ok(()),
    }
}

/// How many ranks this process starts itself (`None`: it is one, or the only one). `--dp N` /
/// `--cp N` alone (no launcher around this process) start the ranks they need; `--nproc N` that
/// does not fit the dp × cp mesh is refused before any starts (the error names --nproc, --dp and
/// --cp).
fn ranks_to_start(cfg: &TrainConfig, nproc: Option<usize>) -> Result<Option<usize>> {
    let launched = std::env::var_os("WORLD_SIZE").is_some();
    let shape = mesh_shape(cfg);
    Ok(match nproc {
        Some(n) => {
            rsd_dist::layout(n, shape)?;
            Some(n)
        }
        None if !launched => rsd_dist::MeshShape {
            dp: shape.dp.max(1),
            ..shape
        }
        .processes()
        .filter(|&w| w > 1),
        None => None,
    })
}

/// Another rank's run ended with an error while this one may be waiting for it in a
/// collective (which NCCL would let wait until its timeout): say so and end this process now.
fn stop_on_another_ranks_failure(failure: rsd_dist::Failure) {
    let this = std::env::var("RANK").unwrap_or_default();
    eprintln!(
        "{}",
        rsd_common::report::for_user_from_env(&format!(
            "rsd-train: error: rank {} failed: {}; every rank stops (this is rank {this}, which \
             was waiting for it)",
            failure.rank, failure.message
        ))
    );
    rsd_dist::exit_now(1);
}

/// A panic of this rank is announced to the others as its errors are (then reported as usual).
fn announce_panics(trainer: &Trainer) {
    if let Some(announcer) = trainer.failure_announcer() {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let _ = announcer.announce(&format!("panicked: {info}"));
            report(info);
        }));
    }
}

/// What the main rank prints before the first step: the layout, the model and the batch.
fn print_start(trainer: &Trainer, cfg: &TrainConfig, out: &Path) {
    if trainer.ranks() > 1 {
        eprintln!(
            "rsd-train: {} data-parallel ranks, {} micro-batch(es) each per step",
            trainer.ranks(),
            trainer.accum() / trainer.ranks()
        );
    }
    if trainer.cp_size() > 1 {
        eprintln!(
            "rsd-train: context parallelism over {} ranks: each holds 2 of every sequence's {} \
             chunks (zigzag), K/V gathered per layer; with prefix reuse the perturbed suffix is \
             re-sharded zigzag over the ranks",
            trainer.cp_size(),
            2 * trainer.cp_size()
        );
    }
    eprintln!(
        "rsd-train: {} params, seq_len {}, {} micro-batch(es) of {} row(s) per step, objective \
         {}, out {}",
        trainer.model().config().num_parameters(),
        trainer.seq_len(),
        trainer.accum(),
        cfg.micro_batch,
        objective_name(cfg.objective),
        out.display()
    );
    if cfg.objective.loss() == Objective::Rsd {
        eprintln!(
            "rsd-train: FLOP floor of the rsd skip step with prefix reuse: {:.2}× a standard step \
             (s uniform; `python benches/train_bench.py --config CONFIG.json --len L` measures the real \
             ratio)",
            prefix_reuse_floor(trainer.model().config(), trainer.seq_len() as i64)
        );
    }
}

/// What the main rank prints after the last step: the summary as JSON on stdout, one line on
/// stderr.
fn print_done(summary: &Summary) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(summary)?);
    eprintln!(
        "done: {} steps, loss {} -> {} (means over the first and last {} step{}); checkpoint {}; \
         model {}; metrics {}",
        summary.steps,
        loss_str(summary.first_loss_mean),
        loss_str(summary.last_loss_mean),
        summary.loss_window,
        if summary.loss_window == 1 { "" } else { "s" },
        summary
            .checkpoint
            .as_deref()
            .map_or("-".into(), |p: &Path| p.display().to_string()),
        summary.final_model.as_deref().map_or_else(
            || match summary.interrupted {
                true => "(interrupted)".into(),
                false => "(not saved: save_at_end = false)".into(),
            },
            |p: &Path| p.display().to_string()
        ),
        summary.metrics.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_full_is_recognised_through_typed_and_text_only_errors() {
        let out = Path::new("/nonexistent-rsd-train-out");
        let typed = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::StorageFull))
            .context("writing a checkpoint");
        let text = anyhow::anyhow!(
            "safetensors error x/optimizer.safetensors: IoError(Os {{ code: 28, kind: StorageFull, \
             message: \"No space left on device\" }})"
        );
        let other = anyhow::anyhow!("permission denied");
        for e in [typed, text] {
            let hint = disk_full_hint(&e, out).expect("a disk-full hint");
            assert!(
                hint.contains("none yet") && hint.contains("--resume auto"),
                "{hint}"
            );
        }
        assert!(disk_full_hint(&other, out).is_none());
    }
}
