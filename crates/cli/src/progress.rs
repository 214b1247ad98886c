//! Progress of a long command (`export`, `import`, `format`'s wipe, `benchmark`) on the
//! terminal: one line redrawn at most four times a second with the share done, the rate
//! (of bytes; steps for `benchmark`) and the time left, then one line with what was done. Only where stderr is a terminal and without
//! `--batch-mode`; otherwise nothing at all, so scripts and logs see no carriage returns.
//! (`reencrypt` keeps cryptsetup's own progress line, which scripts parse.)

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

const REDRAW: Duration = Duration::from_millis(250);

pub(crate) struct Progress {
    what: &'static str,
    /// Counting steps (a benchmark's measurements), not bytes.
    steps: bool,
    total: Option<u64>,
    done: u64,
    start: Instant,
    drawn: Option<Instant>,
    on: bool,
}

impl Progress {
    /// `what` is the verb shown ("export"); `total` the bytes to do, where known.
    pub(crate) fn new(ctx: &crate::ctx::Ctx, what: &'static str, total: Option<u64>) -> Self {
        Self::start(ctx, what, total, false)
    }

    /// Counting `total` steps rather than bytes.
    pub(crate) fn steps(ctx: &crate::ctx::Ctx, what: &'static str, total: u64) -> Self {
        Self::start(ctx, what, Some(total), true)
    }

    fn start(ctx: &crate::ctx::Ctx, what: &'static str, total: Option<u64>, steps: bool) -> Self {
        let on = !ctx.batch && std::io::stderr().is_terminal();
        let mut p = Progress {
            what,
            steps,
            total,
            done: 0,
            start: Instant::now(),
            drawn: None,
            on,
        };
        p.draw();
        p
    }

    /// Erases the line, for other output on the terminal (it comes back at the next
    /// [`Progress::add`]).
    pub(crate) fn clear(&mut self) {
        if self.on {
            eprint!("\r\x1b[K");
            self.drawn = None;
        }
    }

    /// `n` more bytes done.
    pub(crate) fn add(&mut self, n: u64) {
        self.set(self.done + n);
    }

    /// `done` bytes done in all.
    pub(crate) fn set(&mut self, done: u64) {
        self.done = done;
        if self.on && self.drawn.is_none_or(|t| t.elapsed() >= REDRAW) {
            self.draw();
        }
    }

    fn draw(&mut self) {
        if !self.on {
            return;
        }
        self.drawn = Some(Instant::now());
        let secs = self.start.elapsed().as_secs_f64();
        let rate = if secs > 0.0 {
            self.done as f64 / secs
        } else {
            0.0
        };
        let line = match self.total {
            Some(t) if t > 0 && self.steps => {
                let left = if self.done > 0 {
                    clock((secs / self.done as f64 * (t - self.done.min(t)) as f64) as u64)
                } else {
                    "--:--".into()
                };
                format!("{}: {} of {t} done, {left} left", self.what, self.done)
            }
            Some(t) if t > 0 => {
                let left = if rate > 0.0 && self.done > 0 {
                    clock(((t - self.done.min(t)) as f64 / rate) as u64)
                } else {
                    "--:--".into()
                };
                format!(
                    "{}: {:5.1}% of {}, {}/s, {left} left",
                    self.what,
                    self.done as f64 * 100.0 / t as f64,
                    bytes(t),
                    bytes(rate as u64)
                )
            }
            _ => format!(
                "{}: {}, {}/s",
                self.what,
                bytes(self.done),
                bytes(rate as u64)
            ),
        };
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[K{line}");
        let _ = e.flush();
    }

    /// The last line: what was done, in how long.
    pub(crate) fn finish(self) {
        if !self.on {
            return;
        }
        let secs = self.start.elapsed().as_secs_f64();
        if self.steps {
            eprintln!("\r\x1b[K{}: {} done in {secs:.1} s", self.what, self.done);
            return;
        }
        let rate = if secs > 0.0 {
            self.done as f64 / secs
        } else {
            0.0
        };
        eprintln!(
            "\r\x1b[K{}: {} in {:.1} s ({}/s)",
            self.what,
            bytes(self.done),
            secs,
            bytes(rate as u64)
        );
    }
}

/// Bytes in binary units, three significant figures.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else if v >= 100.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn clock(secs: u64) -> String {
    if secs >= 3600 {
        format!("{}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
    } else {
        format!("{}:{:02}", secs / 60, secs % 60)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_and_clocks() {
        assert_eq!(super::bytes(512), "512 B");
        assert_eq!(super::bytes(1536), "1.5 KiB");
        assert_eq!(super::bytes(300 << 20), "300 MiB");
        assert_eq!(super::clock(125), "2:05");
        assert_eq!(super::clock(3725), "1:02:05");
    }
}
