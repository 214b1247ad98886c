//! `open --metrics`: Prometheus' text format scraped over HTTP (TCP on loopback, and a unix
//! socket) while fio runs against the volume over NBD, parsed, and held to what fio did.

use crate::common::{bin, free_port, ok, run_in, tool};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;

/// `GET path` over `stream`: the status line and the body.
fn get(mut stream: impl Read + Write, path: &str) -> (String, String) {
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut resp = String::new();
    stream.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP response");
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// Samples by `name{labels}`, every line checked against the text format: HELP and TYPE
/// before each family's samples, a number after each.
fn parse(text: &str) -> HashMap<String, f64> {
    let mut typed = std::collections::HashSet::new();
    let mut samples = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut w = rest.split_whitespace();
            let (name, kind) = (w.next().unwrap(), w.next().unwrap());
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            typed.insert(name.to_string());
            continue;
        }
        if line.starts_with("# HELP ") || line.is_empty() {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
        let name = key.split('{').next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains(*f)))
            .unwrap_or(name);
        assert!(typed.contains(family), "no TYPE before {line}");
        assert!(name.starts_with("cryptblk_"), "{line}");
        let v: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("not a number: {line}"));
        assert!(samples.insert(key.to_string(), v).is_none(), "twice: {key}");
    }
    samples
}

/// fio's nbd engine, 64 KiB requests over 8 MiB (`seconds`: for that long, round and
/// round).
fn fio(uri: &str, rw: &str, seconds: Option<u32>) -> serde_json::Value {
    let mut args = vec![
        "--name=m".to_string(),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        format!("--rw={rw}"),
        "--bs=64k".into(),
        "--iodepth=4".into(),
        "--size=8M".into(),
        "--output-format=json".into(),
    ];
    if let Some(s) = seconds {
        args.extend(["--time_based".into(), format!("--runtime={s}")]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = ok(&run_in(&tool("fio", "fio"), &args, b""));
    serde_json::from_str(&out[out.find('{').unwrap()..]).unwrap()
}

#[test]
fn counters_grow_by_what_fio_did_and_the_histograms_hold_together() {
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    std::fs::write(p("key"), b"metrics passphrase").unwrap();
    crate::common::quick_luks2(&p("v.img"), &p("key"), 32);
    let port = free_port();
    let sock = p("s.sock");
    ok(&run_in(
        bin(),
        &[
            "open",
            &p("v.img"),
            "mvol",
            "--nbd",
            &format!("unix:{sock}"),
            "--metrics",
            &format!("tcp:127.0.0.1:{port}"),
            "--daemon",
            "--run-dir",
            &p("run"),
            "--key-file",
            &p("key"),
        ],
        b"",
    ));
    let scrape = || {
        let (status, body) = get(
            std::net::TcpStream::connect(format!("127.0.0.1:{port}")).unwrap(),
            "/metrics",
        );
        assert_eq!(status, "HTTP/1.1 200 OK");
        parse(&body)
    };
    let before = scrape();
    let k = |name: &str, op: &str| format!("{name}{{volume=\"mvol\",op=\"{op}\"}}");
    let uri = format!("nbd+unix:///mvol?socket={sock}");
    // Scraped during the writes too: the counters move while fio runs.
    let writer = {
        let uri = uri.clone();
        std::thread::spawn(move || fio(&uri, "write", Some(2)))
    };
    // Until the writes show (fio connects first), while fio still runs.
    let wb = k("cryptblk_request_bytes_total", "write");
    let during = loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let m = scrape();
        if m[&wb] > before[&wb] || writer.is_finished() {
            break m;
        }
    };
    assert!(
        !writer.is_finished(),
        "fio ended before a scrape saw its writes"
    );
    let w = writer.join().unwrap();
    let r = fio(&uri, "read", None);
    let after = scrape();
    assert!(
        before[&wb] < during[&wb] && during[&wb] < after[&wb],
        "during fio: {} < {} < {}",
        before[&wb],
        during[&wb],
        after[&wb]
    );
    let delta = |key: &str| after[key] - before.get(key).copied().unwrap_or(0.0);
    let (wj, rj) = (&w["jobs"][0]["write"], &r["jobs"][0]["read"]);
    assert_eq!(
        delta(&k("cryptblk_request_bytes_total", "write")),
        wj["io_bytes"].as_f64().unwrap()
    );
    assert_eq!(
        delta(&k("cryptblk_request_bytes_total", "read")),
        rj["io_bytes"].as_f64().unwrap()
    );
    assert_eq!(
        delta(&k("cryptblk_requests_total", "write")),
        wj["total_ios"].as_f64().unwrap()
    );
    assert_eq!(
        delta(&k("cryptblk_requests_total", "read")),
        rj["total_ios"].as_f64().unwrap()
    );
    // Every request fio made was timed: the histograms count them, cumulatively.
    for (op, ios) in [
        ("read", rj["total_ios"].as_f64().unwrap()),
        ("write", wj["total_ios"].as_f64().unwrap()),
    ] {
        let count = delta(&k("cryptblk_request_duration_seconds_count", op));
        assert_eq!(count, ios, "{op}");
        let inf = format!(
            "cryptblk_request_duration_seconds_bucket{{volume=\"mvol\",op=\"{op}\",le=\"+Inf\"}}"
        );
        assert_eq!(
            after[&inf],
            after[&k("cryptblk_request_duration_seconds_count", op)]
        );
        let mut buckets: Vec<(f64, f64)> = after
            .iter()
            .filter(|(key, _)| {
                key.starts_with(&format!(
                    "cryptblk_request_duration_seconds_bucket{{volume=\"mvol\",op=\"{op}\",le="
                ))
            })
            .map(|(key, v)| {
                let le = key.rsplit("le=\"").next().unwrap().trim_end_matches("\"}");
                (
                    if le == "+Inf" {
                        f64::INFINITY
                    } else {
                        le.parse().unwrap()
                    },
                    *v,
                )
            })
            .collect();
        buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "cumulative: {buckets:?}"
        );
        assert!(after[&k("cryptblk_request_duration_seconds_sum", op)] > 0.0);
    }
    assert_eq!(after[&k("cryptblk_request_errors_total", "read")], 0.0);
    assert_eq!(after["cryptblk_requests_in_flight{volume=\"mvol\"}"], 0.0);
    assert_eq!(
        after["cryptblk_integrity_failures_total{volume=\"mvol\"}"],
        0.0
    );
    assert!(after.contains_key("cryptblk_clients{volume=\"mvol\"}"));
    assert!(
        after
            .keys()
            .any(|k| k.starts_with("cryptblk_volume_info{volume=\"mvol\",type=\"LUKS2\"")),
        "{:?}",
        after.keys()
    );

    // Other paths and methods are refused; the server goes on.
    let (status, _) = get(
        std::net::TcpStream::connect(format!("127.0.0.1:{port}")).unwrap(),
        "/",
    );
    assert!(status.contains("404"), "{status}");
    // A name that is not loopback's (DNS rebinding) is refused.
    let mut s = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: rebound.example:{port}\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
    let mut s = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    write!(s, "POST /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 405"), "{resp}");
    scrape();
    ok(&run_in(
        bin(),
        &["close", "mvol", "--run-dir", &p("run")],
        b"",
    ));
}

#[test]
fn metrics_on_a_unix_socket_are_private_and_gone_at_close_and_tcp_is_loopback_only() {
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    let m = p("metrics.sock");
    ok(&run_in(
        bin(),
        &[
            "open",
            "mem:16M",
            "uvol",
            "--nbd",
            &format!("unix:{}", p("s.sock")),
            "--metrics",
            &format!("unix:{m}"),
            "--daemon",
            "--run-dir",
            &p("run"),
        ],
        b"",
    ));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&m).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let (status, body) = get(
        std::os::unix::net::UnixStream::connect(&m).unwrap(),
        "/metrics",
    );
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(parse(&body).contains_key("cryptblk_volume_size_bytes{volume=\"uvol\"}"));
    ok(&run_in(
        bin(),
        &["close", "uvol", "--run-dir", &p("run")],
        b"",
    ));
    assert!(!Path::new(&m).exists(), "the socket is removed at close");
    let o = run_in(
        bin(),
        &[
            "open",
            "mem:16M",
            "tvol",
            "--nbd",
            &format!("unix:{}", p("t.sock")),
            "--metrics",
            "tcp:0.0.0.0:9",
            "--run-dir",
            &p("run"),
        ],
        b"",
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("loopback only"));
}
