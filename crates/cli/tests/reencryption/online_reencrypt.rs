//! `cryptblk reencrypt` on a volume being served over NBD (online): the job is handed to
//! the serving process, fio keeps writing and verifying (crc32c) throughout, and the data
//! must verify after the job, after a reopen, and after cryptsetup's checks. A server
//! killed (SIGKILL) mid-job while fio writes reopens (recovering its step) and the job
//! resumes online; a `close` mid-job leaves a state cryptsetup resumes; bad requests
//! change nothing.

use crate::common::*;
use serde_json::Value;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

struct Lab {
    dir: tempfile::TempDir,
}

impl Lab {
    /// A LUKS2 volume: 16 MiB header + 64 MiB of data, 4096-byte sectors.
    fn new() -> Lab {
        Lab::with_sector("4096")
    }
    fn with_sector(ss: &str) -> Lab {
        let lab = Lab {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::write(lab.p("pw"), b"rotate while serving").unwrap();
        std::fs::File::create(lab.p("v.img"))
            .unwrap()
            .set_len(80 << 20)
            .unwrap();
        let (pw, img) = (lab.p("pw"), lab.p("v.img"));
        let mut args = vec!["format", "-q", "--type", "luks2", "--sector-size", ss];
        args.extend(KDF);
        args.extend(["--key-file", &pw, &img]);
        ok(&lab.cb(&args));
        lab
    }
    fn p(&self, f: &str) -> String {
        self.dir.path().join(f).to_str().unwrap().to_string()
    }
    fn cb(&self, args: &[&str]) -> Output {
        run_in(bin(), args, b"")
    }
    fn open(&self, extra: &[&str]) {
        let (img, pw, sock, run) = (
            self.p("v.img"),
            self.p("pw"),
            format!("unix:{}", self.p("s.sock")),
            self.p("run"),
        );
        let mut args = vec![
            "open",
            &img,
            "vol",
            "--nbd",
            &sock,
            "--daemon",
            "--run-dir",
            &run,
            "--key-file",
            &pw,
        ];
        args.extend_from_slice(extra);
        ok(&self.cb(&args));
    }
    fn close(&self) {
        ok(&self.cb(&["close", "vol", "--run-dir", &self.p("run")]));
    }
    fn status(&self) -> Value {
        let out = ok(&self.cb(&["list", "--json", "--run-dir", &self.p("run")]));
        let v: Value = serde_json::from_str(&out).unwrap();
        v[0].clone()
    }
    /// `cryptblk reencrypt` on the image (found served), started in the background.
    fn reencrypt(&self, extra: &[&str]) -> Child {
        let (img, pw, run) = (self.p("v.img"), self.p("pw"), self.p("run"));
        Command::new(bin())
            .args([
                "reencrypt",
                "-q",
                &img,
                "--key-file",
                &pw,
                "--run-dir",
                &run,
            ])
            .args(KDF)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
    /// fio over NBD: two jobs of 24 MiB each writing random 4k-64k blocks (or only
    /// verifying what an identical run wrote); fails the test on any verify error.
    fn fio(&self, verify_only: bool) {
        let out = ok(&self.fio_run(verify_only));
        let j: Value = serde_json::from_str(&out[out.find('{').unwrap()..]).unwrap();
        for job in j["jobs"].as_array().unwrap() {
            assert_eq!(job["error"], 0, "fio verify failed: {job}");
        }
    }
    /// The fio run of [`Lab::fio`], its outcome left to the caller.
    fn fio_run(&self, verify_only: bool) -> Output {
        let uri = format!("nbd+unix:///vol?socket={}", self.p("s.sock"));
        let mut args = vec![
            "--name=online".to_string(),
            "--ioengine=nbd".into(),
            format!("--uri={uri}"),
            "--rw=randwrite".into(),
            "--bsrange=4k-64k".into(),
            "--iodepth=8".into(),
            "--size=24M".into(),
            "--offset_increment=32M".into(),
            "--numjobs=2".into(),
            "--verify=crc32c".into(),
            "--verify_backlog=64".into(),
            "--verify_fatal=1".into(),
            "--randrepeat=1".into(),
            "--output-format=json".into(),
        ];
        if verify_only {
            args.push("--verify_only".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_at(Some(self.dir.path()), &tool("fio", "fio"), &args, b"")
    }
    fn test_passphrase(&self) {
        let (pw, img) = (self.p("pw"), self.p("v.img"));
        ok(&run_in(
            &tool("cryptsetup", "cryptsetup-bin"),
            &["open", "--test-passphrase", "--key-file", &pw, &img],
            b"",
        ));
    }
    /// The header area's bytes (readable while the volume is open, unlike `luksDump`,
    /// which waits for the server's lock).
    fn header(&self) -> Vec<u8> {
        let mut h = std::fs::read(self.p("v.img")).unwrap();
        h.truncate(16 << 20);
        h
    }
    /// `cryptsetup luksDump` (the volume closed).
    fn dump(&self) -> String {
        ok(&run_in(
            &tool("cryptsetup", "cryptsetup-bin"),
            &["luksDump", &self.p("v.img")],
            b"",
        ))
    }
}

/// Waits for `child` (at most 120 s) and returns its output.
fn finish(child: Child) -> Output {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut child = child;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "reencrypt did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn fio_verifies_through_an_online_reencryption_and_after_reopen() {
    let lab = Lab::new();
    lab.open(&[]);
    lab.fio(false);
    // Small steps, so that fio runs during many of them.
    let job = lab.reencrypt(&["--hotzone-size", "1M", "--resilience", "journal"]);
    let mut during = 0;
    let mut job = Some(job);
    while let Some(mut j) = job.take() {
        if j.try_wait().unwrap().is_some() {
            let out = finish(j);
            ok(&out);
            break;
        }
        lab.fio(false);
        during += 1;
        job = Some(j);
    }
    eprintln!("fio runs during the reencryption: {during}");
    assert!(during >= 1, "fio never ran during the reencryption");
    let s = lab.status();
    assert_eq!(s["reencryption"]["state"], "finished", "{s}");
    assert_eq!(
        s["reencryption"]["done_bytes"],
        s["reencryption"]["total_bytes"]
    );
    lab.fio(true);
    lab.close();
    let dump = lab.dump();
    assert!(!dump.contains("reencrypt"), "metadata left:\n{dump}");
    lab.test_passphrase();
    lab.open(&[]);
    lab.fio(true);
    lab.close();
}

#[test]
fn a_server_killed_mid_job_reopens_and_the_job_resumes_online() {
    let lab = Lab::new();
    lab.open(&[]);
    lab.fio(false);
    let pid = lab.status()["pid"].as_i64().unwrap();
    let job = lab.reencrypt(&["--hotzone-size", "1M"]);
    // Kill the server once a few steps are done.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = &lab.status()["reencryption"];
        if r["done_bytes"].as_u64().unwrap_or(0) >= 8 << 20 {
            break;
        }
        assert!(Instant::now() < deadline, "no progress: {r}");
        std::thread::sleep(Duration::from_millis(5));
    }
    // fio writing (the same blocks as the first pass: any mix of old and new blocks
    // verifies) while the server is killed.
    let writer = std::thread::scope(|s| {
        let w = s.spawn(|| lab.fio_run(false));
        std::thread::sleep(Duration::from_millis(100));
        ok(&run_in("kill", &["-9", &pid.to_string()], b""));
        w.join().unwrap()
    });
    eprintln!("fio across the kill: {:?}", writer.status);
    // SIGKILL is not instant: until its last thread ends, the server holds the image.
    wait_exited(pid as i32);
    let out = finish(job);
    assert!(
        !out.status.success(),
        "reencrypt did not notice the server died"
    );
    // The stale socket and pid file stay; the next open replaces them and recovers the
    // step; the job resumes online and finishes.
    lab.open(&[]);
    lab.fio(true);
    ok(&finish(lab.reencrypt(&["--resume-only"])));
    assert_eq!(lab.status()["reencryption"]["state"], "finished");
    lab.fio(true);
    lab.close();
    lab.test_passphrase();
    assert!(!lab.dump().contains("reencrypt"));
}

#[test]
fn close_mid_job_leaves_a_state_cryptsetup_resumes() {
    let lab = Lab::new();
    lab.open(&[]);
    lab.fio(false);
    let job = lab.reencrypt(&["--hotzone-size", "1M"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while lab.status()["reencryption"]["done_bytes"]
        .as_u64()
        .unwrap_or(0)
        < 4 << 20
    {
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    lab.close();
    let out = finish(job);
    assert!(
        !out.status.success(),
        "reencrypt says it finished after a close"
    );
    assert!(lab.dump().contains("reencrypt"), "no job left to resume");
    let (pw, img) = (lab.p("pw"), lab.p("v.img"));
    ok(&run_in(
        &tool("cryptsetup", "cryptsetup-bin"),
        &[
            "reencrypt",
            "-q",
            "--resume-only",
            "--force-offline-reencrypt",
            "--key-file",
            &pw,
            &img,
        ],
        b"",
    ));
    lab.open(&[]);
    lab.fio(true);
    lab.close();
}

#[test]
fn bad_online_requests_are_refused_and_change_nothing() {
    let lab = Lab::with_sector("512");
    lab.open(&[]);
    let before = lab.header();
    let refused = |out: Output, why: &str| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(why), "{why}: {err}");
        assert!(
            lab.header() == before,
            "a refused request changed the header"
        );
    };
    // Wrong passphrase: cryptsetup's exit code 2.
    std::fs::write(lab.p("bad"), b"not it").unwrap();
    let (img, bad, run) = (lab.p("v.img"), lab.p("bad"), lab.p("run"));
    let out = lab.cb(&[
        "reencrypt",
        "-q",
        &img,
        "--key-file",
        &bad,
        "--run-dir",
        &run,
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    refused(out, "No key available");
    // A sector size the clients (512-byte blocks) could not address.
    refused(
        finish(lab.reencrypt(&["--sector-size", "4096"])),
        "larger than the served volume",
    );
    refused(finish(lab.reencrypt(&["--resume-only"])), "not in progress");
    refused(
        finish(lab.reencrypt(&["--encrypt"])),
        "--reduce-device-size",
    );
    // A second job while one runs.
    let first = lab.reencrypt(&["--hotzone-size", "1M"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while lab.status()["reencryption"]["state"] != "running" {
        assert!(Instant::now() < deadline, "the first job never ran");
        std::thread::sleep(Duration::from_millis(2));
    }
    let second = finish(lab.reencrypt(&[]));
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success() && err.contains("already running"),
        "{err}"
    );
    ok(&finish(first));
    lab.close();
    lab.test_passphrase();
}

#[test]
fn a_read_only_served_volume_refuses_online_reencryption() {
    let lab = Lab::new();
    lab.open(&["--readonly"]);
    let before = lab.header();
    let out = finish(lab.reencrypt(&[]));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("read-only"), "{err}");
    assert!(lab.header() == before);
    lab.close();
}

/// An encryption in place with the header on the device (cryptsetup's data move), started
/// by cryptsetup (`--init-only`) and run online by cryptblk: fio writes and verifies
/// throughout, the result verifies after a reopen and passes cryptsetup's checks.
#[test]
fn fio_verifies_through_an_online_data_move_encryption_cryptsetup_started() {
    let lab = Lab::new();
    let (img, pw) = (lab.p("v.img"), lab.p("pw"));
    // 80 MiB of plaintext; an 8 MiB header and an 8 MiB copy leave fio its 64 MiB.
    std::fs::write(&img, vec![0x3cu8; 80 << 20]).unwrap();
    let cs = tool("cryptsetup", "cryptsetup-bin");
    let mut args = vec![
        "reencrypt",
        "-q",
        "--encrypt",
        "--reduce-device-size",
        "16M",
    ];
    args.extend([
        "--init-only",
        "--force-offline-reencrypt",
        "--key-file",
        &pw,
        &img,
    ]);
    args.extend(KDF);
    ok(&run_in(&cs, &args, b""));
    lab.open(&[]);
    lab.fio(false);
    let mut job = lab.reencrypt(&["--resume-only"]);
    let mut during = 0;
    while job.try_wait().unwrap().is_none() {
        lab.fio(false);
        during += 1;
    }
    ok(&finish(job));
    eprintln!("fio runs during the encryption: {during}");
    assert!(during >= 1, "fio never ran during the encryption");
    let s = lab.status();
    assert_eq!(s["reencryption"]["state"], "finished", "{s}");
    assert_eq!(s["reencryption"]["resilience"], "datashift", "{s}");
    lab.fio(true);
    lab.close();
    let dump = lab.dump();
    assert!(!dump.contains("reencrypt"), "metadata left:\n{dump}");
    assert!(dump.contains("offset: 8388608 [bytes]"), "{dump}");
    lab.test_passphrase();
    lab.open(&[]);
    lab.fio(true);
    lab.close();
}

/// A key change with a data shift (`--reduce-device-size 8M`), started with the volume
/// closed and resumed online: fio writes and verifies throughout; the volume is 8 MiB
/// smaller and verifies after a reopen; online the shift cannot start (it shrinks the
/// volume), only resume.
#[test]
fn fio_verifies_through_an_online_key_change_with_a_data_shift() {
    let lab = Lab::new();
    let (img, pw) = (lab.p("v.img"), lab.p("pw"));
    lab.open(&[]);
    // Online, a data shift cannot start.
    let out = finish(lab.reencrypt(&["--reduce-device-size", "8M"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--init-only"),
        "{err}"
    );
    lab.close();
    let mut args = vec![
        "reencrypt",
        "-q",
        "--reduce-device-size",
        "8M",
        "--init-only",
    ];
    args.extend(["--key-file", &pw, &img]);
    args.extend(KDF);
    ok(&lab.cb(&args));
    lab.open(&[]);
    assert_eq!(lab.status()["size_bytes"], 56u64 << 20);
    lab.fio(false);
    let mut job = lab.reencrypt(&["--resume-only"]);
    let mut during = 0;
    while job.try_wait().unwrap().is_none() {
        lab.fio(false);
        during += 1;
    }
    ok(&finish(job));
    eprintln!("fio runs during the shift: {during}");
    assert!(during >= 1, "fio never ran during the job");
    assert_eq!(lab.status()["reencryption"]["state"], "finished");
    lab.fio(true);
    lab.close();
    let dump = lab.dump();
    assert!(!dump.contains("reencrypt"), "metadata left:\n{dump}");
    assert!(dump.contains("offset: 25165824 [bytes]"), "{dump}");
    lab.test_passphrase();
    lab.open(&[]);
    lab.fio(true);
    lab.close();
}

/// Three NBD connections, each writing unique 4 KiB blocks of its own third of the
/// volume until the server goes away; returns every block's last acknowledged content
/// and the blocks whose write was in flight when the server died (of unknown content).
fn write_until_killed(
    sock: &str,
    stop: &std::sync::atomic::AtomicBool,
) -> (std::collections::HashMap<u64, Vec<u8>>, Vec<u64>) {
    use crate::common::nbd::NbdClient;
    use std::sync::atomic::Ordering::Relaxed;
    let (mut acked, mut unknown) = (std::collections::HashMap::new(), Vec::new());
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..3u64)
            .map(|t| {
                s.spawn(move || {
                    let mut c = NbdClient::connect(sock, "vol").unwrap();
                    let blocks = c.size / 4096;
                    let mut mine = std::collections::HashMap::new();
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1) ^ std::process::id() as u64;
                    for seq in 0u64.. {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let b = (x % (blocks / 3)) * 3 + t;
                        let mut data = vec![0u8; 4096];
                        for (i, w) in data.chunks_mut(8).enumerate() {
                            w.copy_from_slice(
                                &(t << 56 ^ seq << 24 ^ b ^ (i as u64) << 40).to_le_bytes(),
                            );
                        }
                        match c.write(b * 4096, &data) {
                            Ok(Ok(())) => {
                                mine.insert(b, data);
                            }
                            // The server died with this write in flight (or refused it).
                            _ => return (mine, Some(b)),
                        }
                        if stop.load(Relaxed) {
                            return (mine, None);
                        }
                    }
                    unreachable!()
                })
            })
            .collect();
        for w in writers {
            let (mine, in_flight) = w.join().unwrap();
            acked.extend(mine);
            unknown.extend(in_flight);
        }
    });
    (acked, unknown)
}

/// A SIGKILL of the server at a random moment of an online job, while three NBD
/// connections write: jobs that move the data (a data-move encryption, `--encrypt
/// --reduce-device-size`; a key change with `--reduce-device-size`) and key changes with
/// checksum and journal resilience. After recovery, by cryptblk's next open or by
/// `cryptsetup repair`, every write the server acknowledged reads back (a data shift's or
/// a journal's recovery rewrites the whole hot zone from the old bytes, so clients'
/// writes into it must wait for the step's commit), and so after the job is finished
/// offline. cryptsetup opens the result.
#[test]
fn sigkill_mid_step_loses_no_acknowledged_write() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let jobs: [(&str, &[&str]); 4] = [
        (
            "data-move encryption",
            &["--encrypt", "--reduce-device-size", "8M"],
        ),
        (
            "key change with a data shift",
            &["--reduce-device-size", "8M"],
        ),
        (
            "key change, checksums",
            &["--resilience", "checksum", "--hotzone-size", "8M"],
        ),
        (
            "key change, journal",
            &["--resilience", "journal", "--hotzone-size", "8M"],
        ),
    ];
    let trials = 2 * jobs.len() as u32;
    let (mut mid_job, mut writes) = (0, 0);
    for trial in 0..trials {
        let (job_name, job) = jobs[trial as usize % jobs.len()];
        let encrypt = job.contains(&"--encrypt");
        let by_cryptsetup = trial as usize >= jobs.len();
        let lab = Lab::new();
        let (img, pw, out) = (lab.p("v.img"), lab.p("pw"), lab.p("plain"));
        let mut init = vec!["reencrypt", "-q", "--init-only"];
        init.extend_from_slice(job);
        if encrypt {
            // 80 MiB of plaintext, encrypted in place with its header at its head.
            let pattern: Vec<u8> = (0..80u32 << 20).map(|i| (i / 4096 * 7 + i) as u8).collect();
            std::fs::write(&img, pattern).unwrap();
        }
        init.extend(["--key-file", &pw, &img]);
        init.extend(KDF);
        ok(&lab.cb(&init));
        let export = |to: &str| {
            let _ = std::fs::remove_file(to);
            ok(&lab.cb(&["export", &img, to, "--key-file", &pw]));
            std::fs::read(to).unwrap()
        };
        let before = export(&out);
        lab.open(&[]);
        let pid = lab.status()["pid"].as_i64().unwrap() as i32;
        let sock = lab.p("s.sock");
        let stop = AtomicBool::new(false);
        let total = before.len() as u64;
        // Killed once the job has done a random share of the data: mid-step mostly.
        let threshold = total * (1 + (std::process::id() as u64 + trial as u64 * 37) % 9) / 10;
        let (acked, unknown, was_mid_job) = std::thread::scope(|s| {
            let writers = s.spawn(|| write_until_killed(&sock, &stop));
            std::thread::sleep(Duration::from_millis(50));
            let resume: &[&str] = if job.contains(&"--hotzone-size") {
                &["--resume-only", "--hotzone-size", "8M"]
            } else {
                &["--resume-only"]
            };
            let job = lab.reencrypt(resume);
            let deadline = Instant::now() + Duration::from_secs(60);
            let state = loop {
                let r = lab.status()["reencryption"].clone();
                let state = r["state"].as_str().unwrap_or("").to_string();
                if state == "finished" || r["done_bytes"].as_u64().unwrap_or(0) >= threshold {
                    break state;
                }
                assert!(Instant::now() < deadline, "no progress: {r}");
                std::thread::sleep(Duration::from_millis(2));
            };
            ok(&run_in("kill", &["-9", &pid.to_string()], b""));
            stop.store(true, Relaxed);
            let (acked, unknown) = writers.join().unwrap();
            let _ = finish(job);
            (acked, unknown, state != "finished")
        });
        wait_exited(pid);
        mid_job += was_mid_job as u32;
        writes += acked.len();
        assert!(acked.len() > 50, "trial {trial}: the writers hardly ran");
        // cryptsetup 2.6.1's repair rewrites the last step of a backward data shift (the
        // zone at the data's start) from the wrong place, its own jobs' too (see
        // reencrypt.rs): there cryptblk's recovery runs instead.
        let last_step_of_a_shift = job.contains(&"--reduce-device-size") && !encrypt && {
            let j = ok(&run_in(
                &tool("cryptsetup", "cryptsetup-bin"),
                &["luksDump", "--dump-json-metadata", &img],
                b"",
            ));
            let v: Value = serde_json::from_str(&j).unwrap();
            v["segments"]["0"]["flags"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f == "in-reencryption"))
        };
        if by_cryptsetup && !last_step_of_a_shift {
            ok(&run_in(
                &tool("cryptsetup", "cryptsetup-bin"),
                &["repair", "-q", "--key-file", &pw, &img],
                b"",
            ));
        } else {
            // The next open recovers the interrupted step.
            lab.open(&[]);
            lab.close();
        }
        let check = |when: &str| {
            let got = export(&out);
            assert!(
                got.len() >= before.len(),
                "trial {trial}: the volume shrank"
            );
            for b in 0..total / 4096 {
                let r = (b * 4096) as usize..(b as usize + 1) * 4096;
                if unknown.contains(&b) {
                    continue;
                }
                let want = acked.get(&b).map_or(&before[r.clone()], |d| &d[..]);
                assert!(
                    got[r] == *want,
                    "trial {trial} ({job_name}, recovered by {}): block {b} {when} is not what \
                     was {}",
                    if by_cryptsetup {
                        "cryptsetup"
                    } else {
                        "cryptblk"
                    },
                    if acked.contains_key(&b) {
                        "acknowledged"
                    } else {
                        "there before"
                    }
                );
            }
        };
        check("after the recovery");
        if lab.dump().contains("reencrypt") {
            let mut resume = vec!["reencrypt", "-q", "--resume-only", "--key-file", &pw, &img];
            resume.extend(KDF);
            ok(&lab.cb(&resume));
            check("after the job finished");
        }
        lab.test_passphrase();
    }
    eprintln!("kills mid-job: {mid_job} of {trials}; blocks acknowledged and checked: {writes}");
    assert!(
        mid_job >= 3,
        "too few kills landed mid-job ({mid_job} of 6)"
    );
}
