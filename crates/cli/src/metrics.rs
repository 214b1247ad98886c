//! `open --metrics unix:PATH|tcp:127.0.0.1:PORT`: the served volume's figures in
//! Prometheus' text exposition format (version 0.0.4) at `GET /metrics`, over plain
//! HTTP/1.1 on a unix socket (0600, as every socket cryptblk makes) or a loopback TCP port.
//! A scrape reads the same figures as `status` plus what only metrics keep: errors,
//! requests in flight and a latency histogram per operation (timed from the moment
//! metrics are asked for; `cryptblk_volume::RequestMetrics`).
//!
//! The server answers one request a connection, with a bounded head (8 KiB, 5 s in all)
//! and at most [`MAX_CONNECTIONS`] at once: a slow or hostile client costs a thread for
//! 5 s at most and never the volume. A `Host` other than a loopback name is refused (a
//! web page could otherwise reach the port through DNS rebinding).

use crate::error::{CliError, CliResult};
use cryptblk_volume::{LATENCY_BOUNDS, Op, VolumeStats};
use serde_json::Value;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

/// Scrapes served at once; more are closed unanswered.
const MAX_CONNECTIONS: usize = 16;

/// A bound metrics listener.
pub(crate) enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

impl Listener {
    /// Binds `spec` (`unix:PATH` or `tcp:ADDR:PORT`, ADDR a loopback address).
    pub(crate) fn bind(spec: &str) -> CliResult<Listener> {
        if let Some(path) = spec.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            crate::rundir::check_socket_path_length(&path)?;
            crate::rundir::clear_stale_socket(&path)?;
            let l = crate::rundir::bind_socket(&path, crate::rundir::SocketAccess::default())?;
            return Ok(Listener::Unix(l, path));
        }
        if let Some(addr) = spec.strip_prefix("tcp:") {
            let sa: std::net::SocketAddr = addr.parse().map_err(|_| {
                CliError::usage(format!(
                    "--metrics {spec}: not ADDRESS:PORT (e.g. tcp:127.0.0.1:9500)"
                ))
            })?;
            if !is_loopback(sa.ip()) {
                return Err(CliError::usage(format!(
                    "--metrics {spec}: metrics listen on loopback only (127.0.0.1, ::1); \
                     let the scraper reach them through a proxy or a unix socket"
                )));
            }
            let l = TcpListener::bind(sa)
                .map_err(|e| CliError::usage(format!("--metrics {spec}: {e}")))?;
            return Ok(Listener::Tcp(l));
        }
        Err(CliError::usage(format!(
            "--metrics {spec}: unix:PATH or tcp:127.0.0.1:PORT"
        )))
    }

    /// Where it listens, for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Listener::Unix(_, p) => format!("unix:{}", p.display()),
            Listener::Tcp(l) => l
                .local_addr()
                .map(|a| format!("tcp:{a}"))
                .unwrap_or_else(|_| "tcp".into()),
        }
    }

    /// The unix socket's path, to remove at close.
    pub(crate) fn path(&self) -> Option<PathBuf> {
        match self {
            Listener::Unix(_, p) => Some(p.clone()),
            Listener::Tcp(_) => None,
        }
    }

    /// Serves scrapes on a thread of its own for the life of the process: `status` gives
    /// the volume's status (as `cryptblk status --json` prints it), `stats` its counters.
    pub(crate) fn serve(
        self,
        status: impl Fn() -> Value + Send + Sync + 'static,
        stats: impl Fn() -> Arc<dyn StatsSource> + Send + Sync + 'static,
    ) {
        let status = Arc::new(status);
        let stats = Arc::new(stats);
        let busy = Arc::new(AtomicUsize::new(0));
        std::thread::spawn(move || {
            loop {
                let accepted: std::io::Result<Box<dyn Conn>> = match &self {
                    Listener::Unix(l, _) => l.accept().map(|(s, _)| Box::new(s) as Box<dyn Conn>),
                    Listener::Tcp(l) => l.accept().map(|(s, _)| Box::new(s) as Box<dyn Conn>),
                };
                let Ok(conn) = accepted else {
                    // Out of descriptors, say: wait rather than spin.
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                };
                if busy.fetch_add(1, Relaxed) >= MAX_CONNECTIONS {
                    busy.fetch_sub(1, Relaxed);
                    continue;
                }
                let (status, stats, busy) = (status.clone(), stats.clone(), busy.clone());
                std::thread::spawn(move || {
                    let _ = answer(conn, || render(&status(), &*stats()));
                    busy.fetch_sub(1, Relaxed);
                });
            }
        });
    }
}

/// `localhost`, or a loopback address, with or without a port.
fn loopback_host(h: &str) -> bool {
    let name = match h.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => h
            .rsplit_once(':')
            .map_or(h, |(n, p)| if p.parse::<u16>().is_ok() { n } else { h }),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(is_loopback)
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v| v.is_loopback()),
    }
}

/// A connection of either kind.
trait Conn: Read + Write + Send {
    fn set_timeouts(&self, d: Duration) -> std::io::Result<()>;
}

impl Conn for std::os::unix::net::UnixStream {
    fn set_timeouts(&self, d: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }
}

impl Conn for std::net::TcpStream {
    fn set_timeouts(&self, d: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }
}

/// Reads one request head and answers it.
fn answer(mut conn: Box<dyn Conn>, body: impl FnOnce() -> String) -> std::io::Result<()> {
    // 5 s for the whole head, not for each read: a client trickling a byte at a time
    // holds its slot no longer.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        conn.set_timeouts(left)?;
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > 8192 {
            return respond(
                &mut *conn,
                "431 Request Header Fields Too Large",
                "text/plain",
                "too large\n",
            );
        }
    }
    let line = String::from_utf8_lossy(&head);
    // A web page the user visits can reach a loopback port by a name of its own that
    // resolves there (DNS rebinding): only loopback names are answered.
    let host = line.lines().skip(1).find_map(|l| {
        l.split_once(':')
            .filter(|(k, _)| k.trim().eq_ignore_ascii_case("host"))
            .map(|(_, v)| v.trim().to_string())
    });
    if let Some(h) = host
        && !loopback_host(&h)
    {
        return respond(
            &mut *conn,
            "403 Forbidden",
            "text/plain",
            "loopback names only\n",
        );
    }
    let mut words = line.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => respond(
            &mut *conn,
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            &body(),
        ),
        ("GET", _) => respond(&mut *conn, "404 Not Found", "text/plain", "see /metrics\n"),
        _ => respond(
            &mut *conn,
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n",
        ),
    }
}

fn respond(conn: &mut dyn Conn, status: &str, kind: &str, body: &str) -> std::io::Result<()> {
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    conn.flush()
}

/// What a scrape reads besides the status: the volume's counters.
pub(crate) trait StatsSource: Send + Sync {
    fn stats(&self) -> &VolumeStats;
}

impl StatsSource for cryptblk_volume::Volume {
    fn stats(&self) -> &VolumeStats {
        cryptblk_volume::Volume::stats(self)
    }
}

/// A label value as the text format writes it.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The exposition text for one volume.
pub(crate) fn render(status: &Value, src: &dyn StatsSource) -> String {
    let st = src.stats();
    let req = &st.requests;
    let vol = label(status["name"].as_str().unwrap_or(""));
    let n = |k: &str| status[k].as_u64().unwrap_or(0);
    let mut out = String::new();
    let head = |out: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    head(
        &mut out,
        "cryptblk_requests_total",
        "counter",
        "Requests served, by operation.",
    );
    for (op, v) in [
        ("read", n("reads")),
        ("write", n("writes")),
        ("flush", n("flushes")),
        ("discard", n("discards_done")),
    ] {
        let _ = writeln!(
            out,
            "cryptblk_requests_total{{volume=\"{vol}\",op=\"{op}\"}} {v}"
        );
    }
    head(
        &mut out,
        "cryptblk_request_bytes_total",
        "counter",
        "Bytes read and written (plaintext), and discarded.",
    );
    for (op, v) in [
        ("read", n("read_bytes")),
        ("write", n("written_bytes")),
        ("discard", st.discarded_bytes.load(Relaxed)),
    ] {
        let _ = writeln!(
            out,
            "cryptblk_request_bytes_total{{volume=\"{vol}\",op=\"{op}\"}} {v}"
        );
    }
    head(
        &mut out,
        "cryptblk_request_errors_total",
        "counter",
        "Requests that failed, by operation.",
    );
    for op in Op::ALL {
        let e = req.op(op).errors.load(Relaxed);
        let _ = writeln!(
            out,
            "cryptblk_request_errors_total{{volume=\"{vol}\",op=\"{}\"}} {e}",
            op.name()
        );
    }
    head(
        &mut out,
        "cryptblk_request_duration_seconds",
        "histogram",
        "Time from a request's start to its end in the volume (decryption, encryption, storage), since metrics were enabled.",
    );
    for op in Op::ALL {
        let m = req.op(op);
        let mut cum = 0;
        for (i, b) in m.buckets.iter().enumerate() {
            cum += b.load(Relaxed);
            let le = LATENCY_BOUNDS
                .get(i)
                .map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(
                out,
                "cryptblk_request_duration_seconds_bucket{{volume=\"{vol}\",op=\"{}\",le=\"{le}\"}} {cum}",
                op.name()
            );
        }
        let _ = writeln!(
            out,
            "cryptblk_request_duration_seconds_sum{{volume=\"{vol}\",op=\"{}\"}} {}",
            op.name(),
            m.sum_nanos.load(Relaxed) as f64 / 1e9
        );
        let _ = writeln!(
            out,
            "cryptblk_request_duration_seconds_count{{volume=\"{vol}\",op=\"{}\"}} {cum}",
            op.name()
        );
    }
    head(
        &mut out,
        "cryptblk_requests_in_flight",
        "gauge",
        "Requests begun and not ended: the queue depth.",
    );
    let _ = writeln!(
        out,
        "cryptblk_requests_in_flight{{volume=\"{vol}\"}} {}",
        req.in_flight.load(Relaxed).max(0)
    );
    head(
        &mut out,
        "cryptblk_clients",
        "gauge",
        "Clients connected to the frontend now.",
    );
    let _ = writeln!(out, "cryptblk_clients{{volume=\"{vol}\"}} {}", n("clients"));
    head(
        &mut out,
        "cryptblk_integrity_failures_total",
        "counter",
        "Sectors whose integrity tag did not verify (each read failed with EIO).",
    );
    let _ = writeln!(
        out,
        "cryptblk_integrity_failures_total{{volume=\"{vol}\"}} {}",
        n("integrity_errors")
    );
    head(
        &mut out,
        "cryptblk_volume_size_bytes",
        "gauge",
        "Size of the served volume.",
    );
    let _ = writeln!(
        out,
        "cryptblk_volume_size_bytes{{volume=\"{vol}\"}} {}",
        n("size_bytes")
    );
    head(
        &mut out,
        "cryptblk_suspended",
        "gauge",
        "1 while the volume is suspended (its keys wiped, I/O held).",
    );
    let _ = writeln!(
        out,
        "cryptblk_suspended{{volume=\"{vol}\"}} {}",
        u8::from(status["suspended"].as_bool().unwrap_or(false))
    );
    head(
        &mut out,
        "cryptblk_reencryption_progress_ratio",
        "gauge",
        "Share of the volume an online reencryption has done (0 to 1; absent without one).",
    );
    if let Some(r) = status["reencryption"].as_object() {
        let (done, total) = (
            r.get("done_bytes").and_then(Value::as_u64).unwrap_or(0),
            r.get("total_bytes").and_then(Value::as_u64).unwrap_or(0),
        );
        let ratio = if total > 0 {
            done as f64 / total as f64
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "cryptblk_reencryption_progress_ratio{{volume=\"{vol}\"}} {ratio}"
        );
        let _ = writeln!(
            out,
            "# HELP cryptblk_reencryption_bytes_per_second Rate of the online reencryption.\n\
             # TYPE cryptblk_reencryption_bytes_per_second gauge\n\
             cryptblk_reencryption_bytes_per_second{{volume=\"{vol}\"}} {}",
            r.get("bytes_per_second")
                .and_then(Value::as_u64)
                .unwrap_or(0)
        );
    }
    head(
        &mut out,
        "cryptblk_volume_info",
        "gauge",
        "The volume's kind, cipher and frontend (always 1).",
    );
    let _ = writeln!(
        out,
        "cryptblk_volume_info{{volume=\"{vol}\",type=\"{}\",cipher=\"{}\",frontend=\"{}\"}} 1",
        label(status["type"].as_str().unwrap_or("")),
        label(status["cipher"].as_str().unwrap_or("")),
        label(status["frontend"].as_str().unwrap_or("")),
    );
    out
}
