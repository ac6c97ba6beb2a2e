//! Progress as lines, for long commands whose stderr is not a terminal (a log file, CI, `nohup`),
//! where a progress bar draws nothing: a line every so often with what is done, the elapsed
//! time and an estimate of the time left.
use std::time::{Duration, Instant};

/// Prints nothing by itself: [`ProgressLines::update`] returns the line when one is due.
#[derive(Debug, Clone)]
pub struct ProgressLines {
    what: &'static str,
    total: u64,
    /// Units already done when this run started (a resumed run), left out of the rate.
    first: u64,
    start: Instant,
    last: Option<Instant>,
    every: Duration,
}

impl ProgressLines {
    /// `total` units of `what` (`"items"`, `"steps"`), `done` of them already done; a line at
    /// most every `every`.
    pub fn new(what: &'static str, total: u64, done: u64, every: Duration) -> ProgressLines {
        ProgressLines {
            what,
            total,
            first: done,
            start: Instant::now(),
            last: None,
            every,
        }
    }

    /// The line to print now that `done` units are done, if one is due: the first update, then
    /// at most one per interval, and always the last unit.
    pub fn update(&mut self, done: u64) -> Option<String> {
        let now = Instant::now();
        let due = match self.last {
            None => true,
            Some(t) => now.duration_since(t) >= self.every || done >= self.total,
        };
        if !due {
            return None;
        }
        self.last = Some(now);
        Some(self.line(done))
    }

    /// The line for `done` units now, due or not.
    pub fn line(&self, done: u64) -> String {
        self.line_after(done, self.start.elapsed())
    }

    /// `done/total what (p%), elapsed E, about R left`.
    fn line_after(&self, done: u64, elapsed: Duration) -> String {
        let pct = if self.total == 0 {
            100.0
        } else {
            100.0 * done as f64 / self.total as f64
        };
        let ran = done.saturating_sub(self.first);
        let left = match (ran, self.total.saturating_sub(done)) {
            (_, 0) => "done".to_string(),
            (0, _) => "time left unknown yet".to_string(),
            (ran, rest) => {
                let secs = elapsed.as_secs_f64() / ran as f64 * rest as f64;
                format!("about {} left", duration(secs))
            }
        };
        format!(
            "{done}/{} {} ({pct:.0}%), {} elapsed, {left}",
            self.total,
            self.what,
            duration(elapsed.as_secs_f64())
        )
    }
}

/// Seconds as `42s`, `3m05s`, `2h07m`.
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_say_what_is_done_and_estimate_the_rest_from_this_runs_rate() {
        let p = ProgressLines::new("items", 100, 20, Duration::from_secs(30));
        // 10 items in 60 s this run: 70 left take 420 s.
        assert_eq!(
            p.line_after(30, Duration::from_secs(60)),
            "30/100 items (30%), 1m00s elapsed, about 7m00s left"
        );
        assert_eq!(
            p.line_after(20, Duration::from_secs(1)),
            "20/100 items (20%), 1s elapsed, time left unknown yet"
        );
        assert_eq!(
            p.line_after(100, Duration::from_secs(7300)),
            "100/100 items (100%), 2h01m elapsed, done"
        );
    }

    #[test]
    fn the_first_and_last_updates_print_and_the_rest_wait_for_the_interval() {
        let mut p = ProgressLines::new("steps", 3, 0, Duration::from_secs(3600));
        assert!(p.update(0).is_some());
        assert!(p.update(1).is_none());
        assert!(p.update(3).is_some_and(|l| l.starts_with("3/3 steps")));
    }
}
