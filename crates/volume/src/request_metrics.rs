//! Per-operation request metrics of a volume, for `open --metrics` (Prometheus): errors
//! always, and once enabled, the requests in flight and a latency histogram per operation
//! (two clock reads a request; nothing when no one scrapes).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// The operations measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Reads (of the plaintext).
    Read,
    /// Writes, write-zeroes included.
    Write,
    /// Flushes.
    Flush,
    /// Discards.
    Discard,
}

impl Op {
    /// Every operation, in label order.
    pub const ALL: [Op; 4] = [Op::Read, Op::Write, Op::Flush, Op::Discard];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Discard => "discard",
        }
    }
}

/// Upper bounds of the latency buckets, in seconds (then +Inf): 25 µs to 10 s, for
/// requests from RAM-fast to storage on a cluster under load.
pub const LATENCY_BOUNDS: [f64; 16] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 10.0,
];

/// One operation's errors and latency histogram (buckets not cumulative here).
#[derive(Debug, Default)]
pub struct OpMetrics {
    /// Requests that failed.
    pub errors: AtomicU64,
    /// Requests per bucket of [`LATENCY_BOUNDS`], the last one past them all.
    pub buckets: [AtomicU64; LATENCY_BOUNDS.len() + 1],
    /// Their time, summed.
    pub sum_nanos: AtomicU64,
    /// Requests timed.
    pub count: AtomicU64,
}

/// The recorder.
#[derive(Debug, Default)]
pub struct RequestMetrics {
    enabled: AtomicBool,
    /// Requests begun and not yet ended (while timing is on): the queue depth.
    pub in_flight: AtomicI64,
    ops: [OpMetrics; 4],
}

impl RequestMetrics {
    /// Starts timing (from the next request on).
    pub fn enable(&self) {
        self.enabled.store(true, Relaxed);
    }

    /// Whether timing is on.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }

    /// One operation's figures.
    pub fn op(&self, op: Op) -> &OpMetrics {
        &self.ops[op as usize]
    }

    /// Called as a request starts: its start time when timing is on.
    pub fn start(&self) -> Option<Instant> {
        if !self.enabled.load(Relaxed) {
            return None;
        }
        self.in_flight.fetch_add(1, Relaxed);
        Some(Instant::now())
    }

    /// Called as it ends, with what [`RequestMetrics::start`] returned and its result.
    pub fn finish<T>(&self, op: Op, started: Option<Instant>, result: &io::Result<T>) {
        let m = &self.ops[op as usize];
        if result.is_err() {
            m.errors.fetch_add(1, Relaxed);
        }
        let Some(t) = started else {
            return;
        };
        self.in_flight.fetch_sub(1, Relaxed);
        let d = t.elapsed();
        let secs = d.as_secs_f64();
        let i = LATENCY_BOUNDS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(LATENCY_BOUNDS.len());
        m.buckets[i].fetch_add(1, Relaxed);
        m.sum_nanos
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
        m.count.fetch_add(1, Relaxed);
    }

    /// Times `f` as one `op` request.
    pub fn measure<T>(&self, op: Op, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let t = self.start();
        let r = f();
        self.finish(op, t, &r);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_land_in_their_bucket_and_errors_count_without_timing() {
        let m = RequestMetrics::default();
        let _ = m.measure(Op::Read, || Err::<(), _>(io::Error::other("x")));
        assert_eq!(m.op(Op::Read).errors.load(Relaxed), 1);
        assert_eq!(
            m.op(Op::Read).count.load(Relaxed),
            0,
            "not timed before enable"
        );
        m.enable();
        m.measure(Op::Write, || {
            std::thread::sleep(std::time::Duration::from_millis(3));
            Ok(())
        })
        .unwrap();
        let w = m.op(Op::Write);
        assert_eq!(w.count.load(Relaxed), 1);
        // 3 ms or a little more: the (2.5 ms, 5 ms] bucket, or a later one on a slow host.
        let i = w.buckets.iter().position(|b| b.load(Relaxed) == 1).unwrap();
        assert!(LATENCY_BOUNDS[i] >= 0.005, "bucket {i}");
        assert!(w.sum_nanos.load(Relaxed) >= 3_000_000);
        assert_eq!(m.in_flight.load(Relaxed), 0);
    }
}
