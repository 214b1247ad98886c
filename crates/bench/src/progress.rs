//! The benchmark's progress bar.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Progress bar with ETA on stderr (a line per step when stderr is not a terminal).
pub(crate) struct Progress {
    /// Steps (fio runs) expected.
    total: usize,
    /// Steps finished.
    done: usize,
    /// When the bar was created: the measured time per step counts from here.
    start: Instant,
    /// Expected time per step, until one has finished.
    guess: Duration,
    /// stderr is a terminal: redraw one line in place.
    tty: bool,
    /// Without a terminal, the next `show` prints its line.
    log_next: bool,
}

impl Progress {
    /// A bar for `total` steps, each guessed to take `guess_per_step`.
    pub(crate) fn new(total: usize, guess_per_step: Duration) -> Self {
        Progress {
            total,
            done: 0,
            start: Instant::now(),
            guess: guess_per_step,
            tty: std::io::stderr().is_terminal(),
            log_next: false,
        }
    }

    /// Remaining time: the measured mean per step once something ran, else the guess.
    pub(crate) fn eta(&self) -> Duration {
        let left = self.total.saturating_sub(self.done) as u32;
        if self.done == 0 {
            self.guess * left
        } else {
            self.start.elapsed() / self.done as u32 * left
        }
    }

    /// Redraws the bar with `what` as what runs now; without a terminal, prints a line
    /// only for [`Progress::step`] and [`Progress::note`].
    pub(crate) fn show(&self, what: &str) {
        let frac = if self.total == 0 {
            1.0
        } else {
            self.done as f64 / self.total as f64
        };
        let width = 30;
        let full = (frac * width as f64).round() as usize;
        let eta = self.eta().as_secs();
        let line = format!(
            "[{}{}] {}/{} {:>3}% ETA {}m{:02}s {}",
            "#".repeat(full),
            "-".repeat(width - full),
            self.done,
            self.total,
            (frac * 100.0).round(),
            eta / 60,
            eta % 60,
            what
        );
        let mut e = std::io::stderr();
        if self.tty {
            let line: String = line.chars().take(118).collect();
            let _ = write!(e, "\r{line:<118}");
        } else if self.log_next {
            let _ = writeln!(e, "{line}");
        }
        let _ = e.flush();
    }

    /// Counts one finished step; without a terminal, logs one line per step.
    pub(crate) fn step(&mut self, what: &str) {
        self.done += 1;
        self.log_next = true;
        self.show(what);
        self.log_next = false;
    }

    /// A message that is logged even without a terminal (starting a target, ...).
    pub(crate) fn note(&mut self, what: &str) {
        self.log_next = true;
        self.show(what);
        self.log_next = false;
    }

    /// Steps that will not run (a target skipped or failed to start).
    pub(crate) fn drop_steps(&mut self, n: usize) {
        self.total = self.total.saturating_sub(n);
    }

    /// Ends the bar's line on a terminal.
    pub(crate) fn finish(&self) {
        if self.tty {
            let _ = writeln!(std::io::stderr());
        }
    }
}
