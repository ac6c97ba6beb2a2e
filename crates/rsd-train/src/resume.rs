//! The config of a resumed run: the checkpoint's own (`config.toml`), with only the changes the
//! command names.
//!
//! A resumed run is the run that wrote the checkpoint: a key the command does not state keeps the
//! checkpoint's value, whatever the defaults or a config file would say. A key the command states
//! (in `--config` or as a flag) with another value is a change, and changes come in three kinds:
//! how the run is operated (progress, threads, checkpoint cadence, held-out evaluation, the
//! device) changes freely; what the run computes (objective, λ, data, model, layout, schedule,
//! the run directory) changes only when `--allow-change KEY` names it; the seed never changes
//! (the loader's order and every perturbation are drawn from it). Every change is reported.
//! `stop_at` belongs to one invocation, not to the run: a run stopped early resumes to its end
//! unless the command stops it again.
use std::path::{Path, PathBuf};

use crate::checkpoint::{self, Valid};
use crate::config::{Stated, TrainConfig};
use crate::{run_dir, Error, Result};

/// One key whose value the command changes from the checkpoint's.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The config key.
    pub key: &'static str,
    /// The checkpoint's value, as TOML writes it (`(unset)` for an absent optional key).
    pub saved: String,
    /// The value the command gives it.
    pub now: String,
    /// Where the new value comes from: `--key`, or the config file's path.
    pub source: String,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} → {} ({})",
            self.key, self.saved, self.now, self.source
        )
    }
}

/// Keys that change how a run is operated, not what it computes: a resumed run takes the
/// command's value without asking.
const OPERATIONAL: &[&str] = &[
    "progress",
    "profile",
    "save_at_end",
    "loader_workers",
    "threads",
    "save_every",
    "save_every_minutes",
    "end_margin_s",
    "keep",
    "stop_at",
    "dist_timeout",
    "dist_liveness",
    "cp_across_nodes",
    "checkpoint_timeout",
    "heldout_every",
    "heldout_batches",
    "heldout_shards",
    "allow_tokenizer_mismatch",
    "device",
];

/// Keys a resumed run cannot change, with why.
const FIXED: &[(&str, &str)] = &[(
    "seed",
    "the loader's order and every perturbation are drawn from it (for another seed, start a new \
     run from this checkpoint's weights: --model CHECKPOINT/model)",
)];

/// A resumed run's config and the changes the command made to the checkpoint's.
#[derive(Debug, Clone)]
pub struct Resumed {
    /// The config to run.
    pub config: TrainConfig,
    /// What differs from the checkpoint's config, in the config's key order.
    pub changes: Vec<Change>,
}

/// Checks the keys `--allow-change` names.
pub fn check_allowed(allowed: &[String]) -> Result<()> {
    for key in allowed {
        if !TrainConfig::KEYS.contains(&key.as_str()) {
            return Err(Error::Input(format!(
                "--allow-change {key}: not a config key (the keys are listed by --print-config)"
            )));
        }
    }
    Ok(())
}

/// The config for resuming `checkpoint`, whose own config is `saved`: `saved` with the run
/// directory it lies in, the stated keys laid over it, checked. A change of a key that alters the
/// run and is not in `allowed`, or of a fixed key, is an error listing every such change and how
/// to go on.
pub fn config(
    checkpoint: &Path,
    saved: TrainConfig,
    stated: Stated,
    allowed: &[String],
) -> Result<Resumed> {
    check_allowed(allowed)?;
    let mut base = saved;
    // One invocation's own setting, not the run's: a run stopped early resumes to its end.
    base.stop_at = TrainConfig::default().stop_at;
    // The run directory is where the checkpoint lies now (runs move between file systems). One
    // copied out of its run goes where the command says, never where its own config.toml says:
    // that file travels with the checkpoint and could name any directory.
    match run_dir::run_of_checkpoint(checkpoint) {
        Some(run) => base.out = run.display().to_string(),
        None => match stated.out() {
            Some(out) => base.out = out,
            None => {
                return Err(Error::Input(format!(
                "resuming {}: it is not inside a run directory (RUN/checkpoints/step-N), so the \
                 run it continues has no directory; say where it writes with --out DIR (its \
                 config.toml names {}, which is not used unless you pass it)",
                checkpoint.display(),
                    rsd_common::printable::shortened(&base.out)
                )))
            }
        },
    }
    let sources: Vec<(&'static str, Option<String>)> = TrainConfig::KEYS
        .iter()
        .map(|&k| (k, stated.source(k)))
        .collect();
    let mut config = stated.over(base.clone())?;
    if run_dir::same_dir(Path::new(&config.out), Path::new(&base.out)) {
        config.out = base.out.clone();
    }
    let (before, after) = (base.to_toml_table(), config.to_toml_table());
    let changes: Vec<Change> = sources
        .into_iter()
        .filter_map(|(key, source)| {
            let (a, b) = (before.get(key), after.get(key));
            (a != b).then(|| Change {
                key,
                saved: show(a),
                now: show(b),
                // Every changed key was stated (`over` sets nothing else), except the model
                // source a stated `model`/`init` replaces.
                source: source.unwrap_or_else(|| "replaced by the stated model source".into()),
            })
        })
        .collect();
    let mut refused = Vec::new();
    for c in &changes {
        if let Some((_, why)) = FIXED.iter().find(|(k, _)| *k == c.key) {
            refused.push(format!("  {c}: cannot change on resume: {why}"));
        } else if !OPERATIONAL.contains(&c.key) && !allowed.iter().any(|a| a == c.key) {
            refused.push(format!("  {c}"));
        }
    }
    if !refused.is_empty() {
        let named: Vec<&str> = changes
            .iter()
            .filter(|c| !OPERATIONAL.contains(&c.key) && !FIXED.iter().any(|(k, _)| *k == c.key))
            .map(|c| c.key)
            .collect();
        let mut how = String::from(
            "A resumed run keeps its checkpoint's config (config.toml in the checkpoint); keys \
             the command does not give keep their values. To keep the run as it was, leave \
             these out of the command (a --config given on resume must agree with the run's)",
        );
        if !named.is_empty() {
            how.push_str(&format!(
                "; to change them, add --allow-change {}",
                named.join(",")
            ));
        }
        return Err(Error::Input(format!(
            "resuming {}: the command changes the run:\n{}\n{how}.",
            checkpoint.display(),
            refused.join("\n")
        )));
    }
    config.check()?;
    Ok(Resumed { config, changes })
}

/// A value as TOML writes it, `(unset)` for an absent optional key.
fn show(v: Option<&toml::Value>) -> String {
    v.map_or_else(|| "(unset)".into(), |v| v.to_string())
}

/// The run a command asks for: its config, and the checkpoint it continues (if any).
#[derive(Debug, Clone)]
pub struct Run {
    /// The config to run.
    pub config: TrainConfig,
    /// The checkpoint directory the run continues from; `None`: a fresh start.
    pub checkpoint: Option<PathBuf>,
}

/// The run the command asks for: a fresh one (defaults ← `--config` ← flags, as `stated` holds
/// them), or, with `--resume ARG`, a resumed one (the checkpoint's config ← the changes the
/// command states, see [`config`]). What was found and decided on the way is pushed to `notes`,
/// in the order a user should read it, also when an error follows. Nothing under the run
/// directory is changed here: cleaning up is the lock holder's, once it holds the lock.
pub fn resolve_run(
    stated: Stated,
    resume_arg: Option<&str>,
    allow_change: &[String],
    notes: &mut Vec<String>,
) -> Result<Run> {
    let found = match resume_arg {
        None => None,
        Some(arg) => find_checkpoint(arg, &stated, notes)?,
    };
    let Some((dir, valid)) = found else {
        return Ok(Run {
            config: stated.resolve()?,
            checkpoint: None,
        });
    };
    let step = valid.state.step;
    let resumed = config(&dir, valid.config, stated, allow_change)?;
    notes.push(format!(
        "rsd-train: {}resuming from {} (step {step} of {}) with the run's config ({}){}",
        if resume_arg == Some("auto") {
            "--resume auto: "
        } else {
            ""
        },
        dir.display(),
        resumed.config.steps,
        dir.join("config.toml").display(),
        if resumed.changes.is_empty() {
            ", unchanged"
        } else {
            ", changed:"
        }
    ));
    for c in &resumed.changes {
        notes.push(format!("rsd-train:   {c}"));
    }
    Ok(Run {
        config: resumed.config,
        checkpoint: Some(dir),
    })
}

/// The checkpoint `--resume ARG` names, checked with `checkpoint::validate` (the error names the
/// damaged file): `""` the newest checkpoint, `auto` the newest that is complete (or a fresh
/// start, `None`, when there is none), anything else a directory.
fn find_checkpoint(
    arg: &str,
    stated: &Stated,
    notes: &mut Vec<String>,
) -> Result<Option<(PathBuf, Valid)>> {
    let out = || match stated.out() {
        Some(out) => Ok(PathBuf::from(out)),
        None => Err(Error::Input(format!(
            "--resume{}: which run? give its directory with --out DIR (or `out` in --config), \
             or name a checkpoint: --resume DIR/checkpoints/step-N",
            if arg.is_empty() { "" } else { " auto" }
        ))),
    };
    let dir = match arg {
        "auto" => {
            let out = out()?;
            checkpoint::check_checkpoints_dir(&out)?;
            let found = checkpoint::auto_resume(&out);
            for (dir, why) in &found.skipped {
                notes.push(format!(
                    "rsd-train: warning: skipping damaged checkpoint {}: {}",
                    dir.display(),
                    rsd_common::report::for_user_from_env(&why.to_string())
                ));
            }
            return match found.chosen {
                Some(chosen) => Ok(Some(chosen)),
                // Damaged checkpoints and nothing to fall back to: starting over would discard
                // the run's progress without anyone looking at why.
                None if !found.skipped.is_empty() => Err(Error::Input(format!(
                    "--resume auto: no complete checkpoint under {} ({} damaged, see the \
                     warnings); remove them to start over, or resume one with --resume DIR",
                    out.join("checkpoints").display(),
                    found.skipped.len()
                ))),
                None => {
                    notes.push(format!(
                        "rsd-train: --resume auto: no checkpoint under {}; starting fresh",
                        out.join("checkpoints").display()
                    ));
                    Ok(None)
                }
            };
        }
        "" => {
            let out = out()?;
            checkpoint::check_checkpoints_dir(&out)?;
            match checkpoint::list(&out).pop() {
                Some((_, p)) => p,
                None => {
                    return Err(Error::Input(format!(
                        "--resume: no checkpoint under {} (--resume auto starts fresh instead)",
                        out.join("checkpoints").display()
                    )))
                }
            }
        }
        p => PathBuf::from(p),
    };
    let valid = checkpoint::validate(&dir)?;
    Ok(Some((dir, valid)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigOverrides;

    fn saved() -> TrainConfig {
        TrainConfig {
            init: Some("tiny.json".into()),
            out: "/nonexistent/run".into(),
            shards: "data".into(),
            lambda: 0.5,
            steps: 50,
            ..TrainConfig::default()
        }
    }

    fn file(dir: &Path, text: &str) -> std::path::PathBuf {
        let p = dir.join("c.toml");
        std::fs::write(&p, text).expect("write");
        p
    }

    const CKPT: &str = "/nonexistent/run/checkpoints/step-00000050";

    #[test]
    fn the_kinds_name_real_keys() {
        for k in OPERATIONAL.iter().chain(FIXED.iter().map(|(k, _)| k)) {
            assert!(TrainConfig::KEYS.contains(k), "{k}");
        }
    }

    #[test]
    fn unstated_keys_keep_the_checkpoints_values() {
        let r = config(
            Path::new(CKPT),
            saved(),
            Stated::read(None, ConfigOverrides::default()).expect("stated"),
            &[],
        )
        .expect("resume");
        assert_eq!((r.config.lambda, r.config.steps), (0.5, 50));
        assert_eq!(r.config.out, "/nonexistent/run");
        assert!(r.changes.is_empty(), "{:?}", r.changes);
    }

    #[test]
    fn a_changed_run_is_refused_unless_named_and_every_change_is_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = file(dir.path(), "lambda = 1.0\nsteps = 50\nsave_every = 5\n");
        let cli = ConfigOverrides {
            steps: Some(200),
            ..Default::default()
        };
        let stated = Stated::read(Some(&f), cli).expect("stated");
        let e = config(Path::new(CKPT), saved(), stated.clone(), &[])
            .expect_err("λ and steps change")
            .to_string();
        assert!(
            e.contains(&format!("lambda: 0.5 → 1.0 ({})", f.display())),
            "{e}"
        );
        assert!(e.contains("steps: 50 → 200 (--steps)"), "{e}");
        assert!(e.contains("--allow-change lambda,steps"), "{e}");
        assert!(
            !e.contains("save_every"),
            "operational keys are not refused: {e}"
        );

        let allowed = ["lambda".to_string(), "steps".to_string()];
        let r = config(Path::new(CKPT), saved(), stated, &allowed).expect("named");
        assert_eq!((r.config.lambda, r.config.steps), (1.0, 200));
        let keys: Vec<&str> = r.changes.iter().map(|c| c.key).collect();
        assert_eq!(keys, ["lambda", "steps", "save_every"]);
    }

    #[test]
    fn the_seed_never_changes_and_unknown_names_are_refused() {
        let cli = ConfigOverrides {
            seed: Some(7),
            ..Default::default()
        };
        let stated = Stated::read(None, cli).expect("stated");
        let e = config(Path::new(CKPT), saved(), stated, &["seed".into()])
            .expect_err("seed")
            .to_string();
        assert!(
            e.contains("seed: 0 → 7 (--seed): cannot change on resume"),
            "{e}"
        );
        let e = check_allowed(&["lamda".into()])
            .expect_err("typo")
            .to_string();
        assert!(e.contains("--allow-change lamda: not a config key"), "{e}");
    }

    #[test]
    fn a_stated_model_replaces_the_saved_init_as_a_named_change() {
        let cli = ConfigOverrides {
            model: Some("/models/other".into()),
            ..Default::default()
        };
        let stated = Stated::read(None, cli).expect("stated");
        let e = config(Path::new(CKPT), saved(), stated.clone(), &[])
            .expect_err("model")
            .to_string();
        assert!(
            e.contains("model: (unset) → \"/models/other\" (--model)"),
            "{e}"
        );
        assert!(e.contains("init: \"tiny.json\" → (unset)"), "{e}");
        let allowed = ["model".to_string(), "init".to_string()];
        let r = config(Path::new(CKPT), saved(), stated, &allowed).expect("named");
        assert_eq!(
            (r.config.model.as_deref(), r.config.init.as_deref()),
            (Some("/models/other"), None)
        );
    }
}
