//! The time a stopping server has. From the moment a stop is accepted (SIGTERM, SIGINT,
//! `close`), or the frontend ends on its own, the drain, the last flush and the storage's
//! close must end within `--close-timeout`. Any of them can wait on storage that is gone
//! without an error (a cluster down, a remote NBD server stopped): past the limit the
//! process says so and exits with code 4 (an RBD image's lock then expires with its
//! watch), instead of hanging with its control socket and pid file in place.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Serving; `generation` counts the arms, so that a watchdog whose arm was taken
    /// back does not fire for a later one.
    Idle {
        generation: u64,
    },
    Armed {
        generation: u64,
        at: Instant,
    },
    /// The close ended (in time or not): nothing fires any more.
    Done,
}

/// One per served volume; cloned into the signal and control threads.
#[derive(Clone)]
pub(crate) struct ShutdownDeadline {
    state: Arc<(Mutex<State>, Condvar)>,
    limit: Duration,
    on_expiry: Arc<dyn Fn(Duration) + Send + Sync>,
}

impl ShutdownDeadline {
    /// `on_expiry(limit)` runs on the watchdog's thread once an armed deadline passes.
    pub(crate) fn new(
        limit: Duration,
        on_expiry: impl Fn(Duration) + Send + Sync + 'static,
    ) -> Self {
        ShutdownDeadline {
            state: Arc::new((Mutex::new(State::Idle { generation: 0 }), Condvar::new())),
            limit,
            on_expiry: Arc::new(on_expiry),
        }
    }

    pub(crate) fn limit(&self) -> Duration {
        self.limit
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the clock, unless it runs already (the first stop counts) or the close ended.
    pub(crate) fn arm(&self) {
        let mut s = self.lock();
        let State::Idle { generation } = *s else {
            return;
        };
        let generation = generation + 1;
        *s = State::Armed {
            generation,
            at: Instant::now() + self.limit,
        };
        drop(s);
        let me = self.clone();
        std::thread::spawn(move || me.watch(generation));
    }

    /// Takes an arm back: the stop was refused after all (a FUSE file still in use).
    pub(crate) fn disarm(&self) {
        let mut s = self.lock();
        if let State::Armed { generation, .. } = *s {
            *s = State::Idle { generation };
            self.state.1.notify_all();
        }
    }

    /// The close ended: the watchdog stands down for good.
    pub(crate) fn done(&self) {
        *self.lock() = State::Done;
        self.state.1.notify_all();
    }

    fn watch(&self, mine: u64) {
        let mut s = self.lock();
        loop {
            match *s {
                State::Armed { generation, at } if generation == mine => {
                    let now = Instant::now();
                    if now >= at {
                        break;
                    }
                    s = self
                        .state
                        .1
                        .wait_timeout(s, at - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                _ => return,
            }
        }
        drop(s);
        (self.on_expiry)(self.limit);
    }
}

#[cfg(test)]
mod tests {
    use super::ShutdownDeadline;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    fn deadline(ms: u64) -> (ShutdownDeadline, mpsc::Receiver<Instant>) {
        let (tx, rx) = mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        let d = ShutdownDeadline::new(Duration::from_millis(ms), move |_| {
            let _ = tx.lock().unwrap().send(Instant::now());
        });
        (d, rx)
    }

    #[test]
    fn an_armed_deadline_fires_once_after_the_limit() {
        let (d, rx) = deadline(200);
        let t0 = Instant::now();
        d.arm();
        let first = *d.lock();
        // A second stop does not restart the clock.
        d.arm();
        assert_eq!(*d.lock(), first);
        let fired = rx.recv_timeout(Duration::from_secs(60)).expect("fired");
        assert!(fired - t0 >= Duration::from_millis(200), "{:?}", fired - t0);
        assert!(
            rx.recv_timeout(Duration::from_millis(400)).is_err(),
            "fired twice"
        );
    }

    #[test]
    fn a_close_in_time_or_a_refused_stop_fires_nothing() {
        let (d, rx) = deadline(150);
        d.arm();
        d.done();
        // Once done, a late arm (a signal during the exit) starts nothing.
        d.arm();
        assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());

        let (d, rx) = deadline(150);
        d.arm();
        d.disarm();
        assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
        // Armed again later: a new full limit from then, one firing.
        let t0 = Instant::now();
        d.arm();
        let fired = rx.recv_timeout(Duration::from_secs(30)).expect("fired");
        assert!(fired - t0 >= Duration::from_millis(150), "{:?}", fired - t0);
        assert!(
            rx.recv_timeout(Duration::from_millis(400)).is_err(),
            "fired twice"
        );
    }
}
