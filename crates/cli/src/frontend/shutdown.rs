//! The time a stopping server has. From the moment a stop is accepted (SIGTERM, SIGINT,
//! `close`), or the frontend ends on its own, the drain, the last flush and the storage's
//! close must end within `--close-timeout`. Any of them can wait on storage that is gone
//! without an error (a cluster down, a remote NBD server stopped): past the limit the
//! process says so and exits with code 4 (an RBD image's lock then expires with its
//! watch), instead of hanging with its control socket and pid file in place.

use crate::control::Reply;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Serving; `generation` counts the arms, so that a watchdog whose arm was taken
    /// back does not fire for a later one.
    Idle { generation: u64 },
    /// Counting down. `committed`: the stop was accepted (or the frontend ended), and
    /// nothing takes the arm back any more; `forced`: a second signal made it expire.
    Armed {
        generation: u64,
        at: Instant,
        committed: bool,
        forced: bool,
    },
    /// The close ended (in time or not): nothing fires any more.
    Done,
}

/// Why the watchdog ends the process.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Expiry {
    /// The limit passed.
    Limit(Duration),
    /// A second SIGTERM/SIGINT during the close: exit now.
    Signal,
}

impl std::fmt::Display for Expiry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expiry::Limit(d) => write!(
                f,
                "did not drain, flush and close its storage within {d:?} of the stop"
            ),
            Expiry::Signal => write!(f, "a second signal during the close"),
        }
    }
}

/// One per served volume; cloned into the signal and control threads.
#[derive(Clone)]
pub(crate) struct ShutdownDeadline {
    state: Arc<(Mutex<State>, Condvar)>,
    limit: Duration,
    on_expiry: Arc<dyn Fn(Expiry) + Send + Sync>,
}

impl ShutdownDeadline {
    /// `on_expiry` runs on the watchdog's thread once an armed deadline passes.
    pub(crate) fn new(limit: Duration, on_expiry: impl Fn(Expiry) + Send + Sync + 'static) -> Self {
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

    /// Starts the clock for a stop that may still be refused, unless it runs already
    /// (the first stop counts) or the close ended.
    pub(crate) fn arm(&self) {
        self.start(false);
    }

    /// The stop is final (accepted, or the frontend ended on its own): the clock runs
    /// (from the first arm, if there was one) and cannot be taken back.
    pub(crate) fn commit(&self) {
        self.start(true);
    }

    fn start(&self, commit: bool) {
        let mut s = self.lock();
        match &mut *s {
            State::Idle { generation } => {
                let generation = *generation + 1;
                *s = State::Armed {
                    generation,
                    at: Instant::now() + self.limit,
                    committed: commit,
                    forced: false,
                };
                drop(s);
                let me = self.clone();
                std::thread::spawn(move || me.watch(generation));
            }
            State::Armed { committed, .. } => *committed |= commit,
            State::Done => {}
        }
    }

    /// Takes back an arm that was not committed: the stop was refused after all (a FUSE
    /// file still in use).
    pub(crate) fn disarm(&self) {
        let mut s = self.lock();
        if let State::Armed {
            generation,
            committed: false,
            ..
        } = *s
        {
            *s = State::Idle { generation };
            self.state.1.notify_all();
        }
    }

    /// A second signal while a committed stop runs: the watchdog fires now. Whether it
    /// did (false when no stop was accepted yet).
    pub(crate) fn expire_now(&self) -> bool {
        let mut s = self.lock();
        if let State::Armed {
            at,
            committed: true,
            forced,
            ..
        } = &mut *s
        {
            *at = Instant::now();
            *forced = true;
            self.state.1.notify_all();
            return true;
        }
        false
    }

    /// The close ended: the watchdog stands down for good.
    pub(crate) fn done(&self) {
        *self.lock() = State::Done;
        self.state.1.notify_all();
    }

    fn watch(&self, mine: u64) {
        let mut s = self.lock();
        let expiry = loop {
            match *s {
                State::Armed {
                    generation,
                    at,
                    forced,
                    ..
                } if generation == mine => {
                    let now = Instant::now();
                    if now >= at {
                        break if forced {
                            Expiry::Signal
                        } else {
                            Expiry::Limit(self.limit)
                        };
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
        };
        drop(s);
        (self.on_expiry)(expiry);
    }
}

/// The files that make a served volume visible (NAME.ctl, NAME.pid), removed on the way
/// out only while they are still this process's: a new server of the same name may have
/// made its own once the control socket was gone.
pub(crate) struct ExitFiles {
    ctl: std::path::PathBuf,
    ctl_id: std::sync::OnceLock<Option<(u64, u64)>>,
    pid: std::path::PathBuf,
}

impl ExitFiles {
    pub(crate) fn new(ctl: std::path::PathBuf, pid: std::path::PathBuf) -> Arc<Self> {
        Arc::new(ExitFiles {
            ctl,
            ctl_id: std::sync::OnceLock::new(),
            pid,
        })
    }

    /// Notes the control socket just bound, as the one to remove.
    pub(crate) fn bound(&self) {
        let _ = self.ctl_id.set(crate::rundir::identity(&self.ctl));
    }

    pub(crate) fn remove_ctl(&self) {
        crate::rundir::remove_if_same(&self.ctl, self.ctl_id.get().copied().flatten());
    }

    pub(crate) fn remove_pid(&self) {
        let ours = crate::rundir::read_private_file(&self.pid)
            .is_some_and(|s| s.trim() == std::process::id().to_string());
        if ours {
            let _ = std::fs::remove_file(&self.pid);
        }
    }
}

/// The connection of the `close` that was accepted: it hears how the close ended
/// (`closed`, or `error CODE: why`) before the process exits, even when it is handed over
/// only after that was decided. A `close` being taken is announced first (`expect`): the
/// stop it makes can end the whole close before its connection is kept, and the process
/// must not exit (and leave it without an answer) in between.
#[derive(Default)]
pub(crate) struct Closer {
    state: Mutex<CloserState>,
    handed: Condvar,
}

#[derive(Default)]
struct CloserState {
    conn: Option<std::os::unix::net::UnixStream>,
    last: Option<String>,
    /// A `close` is being taken: its connection is kept, or given up, soon.
    awaited: bool,
}

/// How long the last line waits for a `close` being taken to hand its connection over
/// (it is microseconds away; bounded all the same, the process must exit).
const HANDOVER_WAIT: Duration = Duration::from_secs(2);

impl Closer {
    fn lock(&self) -> MutexGuard<'_, CloserState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A `close` is being taken: the last line waits (briefly) for its `keep` or
    /// `give_up`.
    pub(crate) fn expect(&self) {
        self.lock().awaited = true;
    }

    /// The `close` being taken was refused (or its client went away).
    pub(crate) fn give_up(&self) {
        self.lock().awaited = false;
        self.handed.notify_all();
    }

    pub(crate) fn keep(&self, conn: std::os::unix::net::UnixStream) {
        let mut s = self.lock();
        s.conn = Some(conn);
        s.awaited = false;
        Self::send(&mut s);
        self.handed.notify_all();
    }

    /// Tells the waiting `close` (now, or once it is kept) its last line; waits for a
    /// `close` being taken at most `HANDOVER_WAIT`, and never long for its reader.
    pub(crate) fn tell(&self, reply: &Reply) {
        self.tell_within(reply, HANDOVER_WAIT);
    }

    /// `tell`, waiting for a `close` being taken at most `wait`: the watchdog, which
    /// must end the process now (that `close` may be stuck behind the hung storage).
    pub(crate) fn tell_within(&self, reply: &Reply, wait: Duration) {
        let mut s = self.lock();
        s.last.get_or_insert_with(|| reply.to_string());
        Self::send(&mut s);
        let (s, _) = self
            .handed
            .wait_timeout_while(s, wait, |s| s.awaited)
            .unwrap_or_else(|e| e.into_inner());
        drop(s);
    }

    fn send(s: &mut CloserState) {
        use std::io::Write;
        // The connection is taken only once there is a line to give it.
        let Some(line) = &s.last else { return };
        if let Some(mut c) = s.conn.take() {
            let _ = c.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = writeln!(c, "{line}");
        }
    }
}

/// Writes `msg` to stderr on a thread of its own and waits for it at most a second: a
/// stderr nobody reads (a full pipe) or that fails must not keep a stuck process up.
pub(crate) fn say_briefly(msg: String) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{msg}");
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(Duration::from_secs(1));
}

#[cfg(test)]
mod tests {
    use super::{Closer, Expiry, HANDOVER_WAIT, ShutdownDeadline};
    use crate::control::Reply;
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    fn deadline(ms: u64) -> (ShutdownDeadline, mpsc::Receiver<(Instant, Expiry)>) {
        let (tx, rx) = mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        let d = ShutdownDeadline::new(Duration::from_millis(ms), move |why| {
            let _ = tx.lock().unwrap().send((Instant::now(), why));
        });
        (d, rx)
    }

    fn quiet(rx: &mpsc::Receiver<(Instant, Expiry)>) -> bool {
        rx.recv_timeout(Duration::from_millis(400)).is_err()
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
        let (fired, why) = rx.recv_timeout(Duration::from_secs(60)).expect("fired");
        assert!(fired - t0 >= Duration::from_millis(200), "{:?}", fired - t0);
        assert_eq!(why, Expiry::Limit(Duration::from_millis(200)));
        assert!(quiet(&rx), "fired twice");
    }

    #[test]
    fn a_close_in_time_or_a_refused_stop_fires_nothing() {
        let (d, rx) = deadline(150);
        d.arm();
        d.done();
        // Once done, a late arm (a signal during the exit) starts nothing.
        d.arm();
        d.commit();
        assert!(quiet(&rx));

        let (d, rx) = deadline(150);
        d.arm();
        d.disarm();
        assert!(quiet(&rx));
        // Armed again later: a new full limit from then, one firing.
        let t0 = Instant::now();
        d.arm();
        let (fired, _) = rx.recv_timeout(Duration::from_secs(30)).expect("fired");
        assert!(fired - t0 >= Duration::from_millis(150), "{:?}", fired - t0);
        assert!(quiet(&rx), "fired twice");
    }

    #[test]
    fn a_committed_stop_is_not_taken_back_and_a_second_signal_ends_it_now() {
        // Accepted stop, then another one refused (a FUSE file unmounted meanwhile):
        // the clock keeps running.
        let (d, rx) = deadline(300);
        d.arm();
        d.commit();
        d.disarm();
        assert!(rx.recv_timeout(Duration::from_secs(60)).is_ok());
        // The frontend ended on its own (commit without a stop), then a refused stop.
        let (d, rx) = deadline(300);
        d.commit();
        d.arm();
        d.disarm();
        assert!(rx.recv_timeout(Duration::from_secs(60)).is_ok());
        // No stop accepted yet: a signal does not force anything.
        let (d, rx) = deadline(60_000);
        assert!(!d.expire_now());
        d.arm();
        assert!(!d.expire_now());
        assert!(quiet(&rx));
        // Accepted: a second signal fires the watchdog long before the limit.
        d.commit();
        let t0 = Instant::now();
        assert!(d.expire_now());
        let (fired, why) = rx.recv_timeout(Duration::from_secs(30)).expect("fired");
        assert_eq!(why, Expiry::Signal);
        assert!(fired - t0 < Duration::from_secs(30));
        assert!(quiet(&rx), "fired twice");
    }

    #[test]
    fn the_closer_hears_the_last_line_once_whichever_comes_first() {
        use std::io::Read;
        use std::os::unix::net::UnixStream;
        let read_all = |mut c: UnixStream| {
            let mut out = String::new();
            c.read_to_string(&mut out).unwrap();
            out
        };
        // Kept, then told: the line arrives; a later line is not sent.
        let closer = Closer::default();
        let (ours, theirs) = UnixStream::pair().unwrap();
        closer.keep(ours);
        closer.tell(&Reply::Closed);
        closer.tell(&Reply::Error {
            code: 4,
            message: "too late".into(),
        });
        drop(closer);
        assert_eq!(read_all(theirs), "closed\n");
        // Told first (the close ended while the connection was being handed over).
        let closer = Closer::default();
        closer.tell(&Reply::Error {
            code: 4,
            message: "gave up".into(),
        });
        let (ours, theirs) = UnixStream::pair().unwrap();
        closer.keep(ours);
        drop(closer);
        assert_eq!(read_all(theirs), "error 4: gave up\n");
        // Told while a `close` is being taken: the teller (the exiting main thread) waits
        // for the handover, so the line is written before it goes on.
        let closer = Arc::new(Closer::default());
        closer.expect();
        let (ours, theirs) = UnixStream::pair().unwrap();
        let t = Instant::now();
        let taker = {
            let closer = closer.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                closer.keep(ours);
            })
        };
        closer.tell(&Reply::Closed);
        // `keep` runs 200 ms after `t` at the earliest: a `tell` that waited for it
        // cannot return sooner, however the threads are scheduled.
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        theirs.set_nonblocking(true).unwrap();
        let mut got = [0u8; 7];
        assert_eq!(
            (&theirs).read(&mut got).unwrap(),
            7,
            "written before tell returned"
        );
        assert_eq!(&got, b"closed\n");
        taker.join().unwrap();
        // A refused `close` ends the wait; nobody is told.
        let closer = Arc::new(Closer::default());
        closer.expect();
        let refuser = {
            let closer = closer.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                closer.give_up();
            })
        };
        let t = Instant::now();
        closer.tell(&Reply::Closed);
        assert!(t.elapsed() < HANDOVER_WAIT, "{:?}", t.elapsed());
        refuser.join().unwrap();
        // A handover that never comes is waited for only HANDOVER_WAIT.
        let closer = Closer::default();
        closer.expect();
        let t = Instant::now();
        closer.tell(&Reply::Closed);
        assert!(t.elapsed() >= HANDOVER_WAIT && t.elapsed() < 5 * HANDOVER_WAIT);
    }
}
