//! `luksSuspend` / `luksResume` on a volume served over NBD: while suspended a client's
//! read is held (it completes, with the right data, once resumed), a wrong passphrase
//! leaves it suspended, `close` is refused, and the volume key is gone from the server's
//! memory (scanned through /proc/PID/mem as root: present before, absent while suspended,
//! present again after resume). A LUKS2 volume with integrity suspends and resumes too.

use crate::common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Lab {
    dir: tempfile::TempDir,
}

/// A test that fails part way leaves no server behind: a suspended one refuses SIGTERM
/// (it holds I/O until `luksResume`), so every server still listed is killed.
impl Drop for Lab {
    fn drop(&mut self) {
        let run = self.p("run");
        // Bounded: a server wedged in the failure must not hang the test run.
        let Ok(out) = Command::new("timeout")
            .args(["20", bin(), "list", "--json", "--run-dir", &run])
            .stdin(Stdio::null())
            .output()
        else {
            return;
        };
        let Ok(list) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
            return;
        };
        for pid in list
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["pid"].as_u64())
        {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

impl Lab {
    fn p(&self, f: &str) -> String {
        self.dir.path().join(f).to_str().unwrap().to_string()
    }
    fn cb(&self, args: &[&str]) -> std::process::Output {
        let run = self.p("run");
        let mut a = args.to_vec();
        a.extend(["--run-dir", &run]);
        run_in(bin(), &a, b"")
    }
    fn uri(&self) -> String {
        format!("nbd+unix:///vol?socket={}", self.p("s.sock"))
    }
}

/// Whether `needle` appears in the readable private memory of process `pid`.
fn in_memory(pid: u32, needle: &[u8]) -> bool {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (range, perms) = (f.next().unwrap(), f.next().unwrap());
        if !perms.starts_with("rw") {
            continue;
        }
        let (a, b) = range.split_once('-').unwrap();
        let (mut at, end) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        while at < end {
            let n = ((end - at) as usize).min(buf.len());
            let Ok(got) = mem.read_at(&mut buf[..n], at) else {
                break;
            };
            if got == 0 {
                break;
            }
            let hay = &buf[..got];
            let mut i = 0;
            while let Some(p) = hay[i..].iter().position(|&x| x == needle[0]) {
                let s = i + p;
                if hay[s..].starts_with(needle) {
                    return true;
                }
                i = s + 1;
            }
            // Overlap the next read so that a needle across the boundary is seen.
            at += got.saturating_sub(needle.len()).max(1) as u64;
        }
    }
    false
}

#[test]
fn suspend_holds_io_and_wipes_the_key_until_resume() {
    let lab = Lab {
        dir: tempfile::tempdir().unwrap(),
    };
    let cs = tool("cryptsetup", "cryptsetup-bin");
    std::fs::write(lab.p("pw"), b"hold everything").unwrap();
    std::fs::write(lab.p("bad"), b"not it").unwrap();
    let img = lab.p("v.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(48 << 20)
        .unwrap();
    let pw = lab.p("pw");
    ok(&run_in(
        &cs,
        &[
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &pw,
            &img,
        ],
        b"",
    ));
    let out = ok(&run_in(
        &cs,
        &[
            "luksDump",
            "--dump-volume-key",
            "-q",
            "--key-file",
            &pw,
            &img,
        ],
        b"",
    ));
    let key = dumped_volume_key(&out);
    assert_eq!(key.len(), 64, "{out}");
    ok(&lab.cb(&[
        "open",
        &img,
        "vol",
        "--nbd",
        &format!("unix:{}", lab.p("s.sock")),
        "--daemon",
        "--key-file",
        &pw,
    ]));
    let data: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
        .collect();
    std::fs::write(lab.p("src"), &data).unwrap();
    let nbdcopy = tool("nbdcopy", "libnbd-bin");
    ok(&run_in(&nbdcopy, &[&lab.p("src"), &lab.uri()], b""));
    let status: serde_json::Value =
        serde_json::from_str(&ok(&lab.cb(&["list", "--json"]))).unwrap();
    let pid = status[0]["pid"].as_u64().unwrap() as u32;
    // The two XTS keys' first 16 bytes: the first round key of each AES key schedule.
    let halves = [&key[..16], &key[32..48]];
    let root = is_root();
    if root {
        assert!(
            halves.iter().all(|h| in_memory(pid, h)),
            "the scan cannot see the key"
        );
    } else {
        eprintln!("NOT RUN: the memory scan of the server needs root (/proc/PID/mem)");
    }

    ok(&lab.cb(&["luksSuspend", "vol"]));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&ok(&lab.cb(&["list", "--json"]))).unwrap()[0]["suspended"],
        true
    );
    // As cryptsetup marks it, for scripts that grep `status`.
    let status = ok(&lab.cb(&["status", "vol"]));
    assert!(
        status.contains("  mode:    read/write (suspended)\n"),
        "{status}"
    );
    if root {
        for h in halves {
            assert!(
                !in_memory(pid, h),
                "key bytes still in the server's memory while suspended"
            );
        }
    }
    // A read is held while suspended.
    let mut reader = Command::new(&nbdcopy)
        .args([&lab.uri(), &lab.p("out")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        reader.try_wait().unwrap().is_none(),
        "a read went through a suspended volume"
    );
    // Wrong passphrase: cryptsetup's exit code, still suspended; close refused.
    let out = lab.cb(&["luksResume", "vol", "--key-file", &lab.p("bad")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(reader.try_wait().unwrap().is_none());
    let out = lab.cb(&["close", "vol"]);
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert_eq!(
        lab.cb(&["luksSuspend", "vol"]).status.code(),
        Some(5),
        "suspended twice"
    );
    // Resume: the held read completes with the data.
    ok(&lab.cb(&["luksResume", "vol", "--key-file", &pw]));
    let deadline = Instant::now() + Duration::from_secs(30);
    let st = loop {
        if let Some(st) = reader.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the held read never finished");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(st.success());
    assert!(std::fs::read(lab.p("out")).unwrap()[..data.len()] == data[..]);
    if root {
        assert!(
            halves.iter().all(|h| in_memory(pid, h)),
            "resumed without the key?"
        );
    }
    assert!(
        !lab.cb(&["luksResume", "vol", "--key-file", &pw])
            .status
            .success(),
        "resumed twice"
    );
    ok(&lab.cb(&["close", "vol"]));
    // A plain volume has no header to resume with: refused.
    ok(&lab.cb(&[
        "open",
        "mem:8M",
        "m",
        "--nbd",
        &format!("unix:{}", lab.p("m.sock")),
        "--daemon",
    ]));
    let out = lab.cb(&["luksSuspend", "m"]);
    assert!(!out.status.success());
    ok(&lab.cb(&["close", "m"]));
}

/// LUKS2 with integrity (AES-GCM over dm-integrity's journal): a write left in the journal
/// (not flushed) survives a suspend, which closes the dm-integrity device as the kernel's
/// postsuspend does and drops its key (gone from the server's memory as root sees it); a
/// read is held until resume, which opens the device again with the header's key; the
/// volume then serves, writes, and after a close and a fresh open reads back everything.
#[test]
fn suspend_and_resume_a_volume_with_integrity() {
    use crate::common::nbd::NbdClient;
    let lab = Lab {
        dir: tempfile::tempdir().unwrap(),
    };
    let pw = lab.p("pw");
    std::fs::write(&pw, b"authenticated and held").unwrap();
    let img = lab.p("v.img");
    quick_luks2_with(
        &img,
        &pw,
        24,
        &[
            "--cipher",
            "aes-gcm-random",
            "--integrity",
            "aead",
            "--key-size",
            "256",
            "--sector-size",
            "4096",
            "--integrity-no-wipe",
        ],
    );
    let key = dumped_volume_key(&ok(&run_in(
        bin(),
        &["dump", "--dump-volume-key", "--key-file", &pw, &img],
        b"",
    )));
    assert_eq!(key.len(), 32);
    let sock = lab.p("s.sock");
    let nbd = format!("unix:{sock}");
    let serve = || {
        ok(&lab.cb(&[
            "open",
            &img,
            "vol",
            "--nbd",
            &nbd,
            "--daemon",
            "--key-file",
            &pw,
        ]))
    };
    serve();
    let data: Vec<u8> = (0..64 * 4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 9) as u8)
        .collect();
    let mut c = NbdClient::connect(&sock, "vol").unwrap();
    c.write(0, &data).unwrap().unwrap();
    let pid = serde_json::from_str::<serde_json::Value>(&ok(&lab.cb(&["list", "--json"]))).unwrap()
        [0]["pid"]
        .as_u64()
        .unwrap() as u32;
    // AES-256's first round key is the key's first 16 bytes.
    let root = is_root();
    if root {
        assert!(in_memory(pid, &key[..16]), "the scan cannot see the key");
    } else {
        eprintln!("NOT RUN: the memory scan of the server needs root (/proc/PID/mem)");
    }
    ok(&lab.cb(&["suspend", "vol"]));
    if root {
        assert!(
            !in_memory(pid, &key[..16]),
            "key bytes still in the server's memory while suspended"
        );
    }
    // A read on the open connection is held.
    let reader = std::thread::spawn(move || {
        let got = c.read(0, 64 * 4096).unwrap();
        (c, got)
    });
    std::thread::sleep(Duration::from_millis(800));
    assert!(
        !reader.is_finished(),
        "a read went through a suspended volume"
    );
    std::fs::write(lab.p("bad"), b"not it").unwrap();
    let out = lab.cb(&["resume", "vol", "--key-file", &lab.p("bad")]);
    assert_eq!(out.status.code(), Some(2), "a wrong passphrase: {out:?}");
    assert!(!reader.is_finished());
    ok(&lab.cb(&["resume", "vol", "--key-file", &pw]));
    let (mut c, got) = reader.join().unwrap();
    assert!(got.unwrap() == data, "the held read after resume");
    c.write(64 * 4096, &data[..8 * 4096]).unwrap().unwrap();
    c.flush().unwrap().unwrap();
    c.disconnect();
    ok(&lab.cb(&["close", "vol"]));
    // A fresh server (the journal replayed from the disk) reads both writes.
    serve();
    let mut c = NbdClient::connect(&sock, "vol").unwrap();
    assert!(c.read(0, 64 * 4096).unwrap().unwrap() == data);
    assert!(c.read(64 * 4096, 8 * 4096).unwrap().unwrap() == data[..8 * 4096]);
    c.disconnect();
    ok(&lab.cb(&["close", "vol"]));
}
