//! Key hygiene of a running `cryptblk open` server: the passphrase is in neither its argv
//! nor its environment, the process is not dumpable, and in its memory (read as root through
//! /proc/PID/mem) the volume key sits only in mlocked pages while the passphrase is gone.

use crate::common::nbd::NbdClient;
use crate::common::{bin, ok, run_in};
use std::os::unix::fs::FileExt;

const PASS: &[u8] = b"correct horse key-hygiene battery";

struct Region {
    start: u64,
    end: u64,
    locked: bool,
}

fn regions(pid: i32) -> Vec<Region> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut out: Vec<Region> = Vec::new();
    for line in smaps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if let Some((a, b)) = f.first().and_then(|x| x.split_once('-'))
            && let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
        {
            let readable = f.get(1).is_some_and(|p| p.starts_with('r'));
            let special = matches!(f.get(5), Some(&"[vvar]") | Some(&"[vsyscall]"));
            // Unreadable regions are recorded empty so VmFlags land on the right entry.
            let end = if readable && !special { end } else { start };
            out.push(Region {
                start,
                end,
                locked: false,
            });
        } else if let Some(flags) = line.strip_prefix("VmFlags:")
            && let Some(r) = out.last_mut()
        {
            r.locked = flags.split_whitespace().any(|f| f == "lo");
        }
    }
    out
}

/// Every place in the process's memory where one of `needles` occurs: (address, mlocked).
fn scan(pid: i32, needles: &[&[u8]]) -> Vec<(u64, bool)> {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut found = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut scanned = 0u64;
    let overlap = needles.iter().map(|n| n.len()).max().unwrap() as u64 - 1;
    for r in regions(pid) {
        let mut addr = r.start;
        while addr < r.end {
            let n = ((r.end - addr) as usize).min(buf.len());
            if mem.read_exact_at(&mut buf[..n], addr).is_err() {
                break;
            }
            scanned += n as u64;
            for nd in needles {
                for (i, w) in buf[..n].windows(nd.len()).enumerate() {
                    if w == *nd {
                        found.push((addr + i as u64, r.locked));
                    }
                }
            }
            if (n as u64) <= overlap {
                break;
            }
            addr += n as u64 - overlap;
        }
    }
    assert!(scanned > 1 << 20, "scanned only {scanned} bytes of {pid}");
    found.sort();
    found.dedup();
    found
}

#[test]
fn server_keeps_keys_locked_and_out_of_argv_env_and_dumps() {
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    let (img, vk, sock, run_dir) = (p("v.img"), p("vk"), p("s.sock"), p("run"));
    let key: Vec<u8> = (0..64u32).map(|i| (i * 73 + 11) as u8 ^ 0xc3).collect();
    std::fs::write(&vk, &key).unwrap();
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    // Passphrases come on stdin, as a user piping one would.
    let mut line = PASS.to_vec();
    line.push(b'\n');
    ok(&run_in(
        bin(),
        &[
            "format",
            "-q",
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--volume-key-file",
            &vk,
            &img,
        ],
        &line,
    ));
    ok(&run_in(
        bin(),
        &[
            "open",
            &img,
            "vol",
            "--nbd",
            &format!("unix:{sock}"),
            "--daemon",
            "--run-dir",
            &run_dir,
        ],
        &line,
    ));
    let pid: i32 = std::fs::read_to_string(format!("{run_dir}/vol.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Real I/O, so the data path has used the key on several threads.
    let mut c = NbdClient::connect(&sock, "vol").unwrap();
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
    c.write(0, &data).unwrap().unwrap();
    c.write(4096 + 7, &data[..3000]).unwrap().unwrap();
    c.flush().unwrap().unwrap();
    assert!(c.read(0, 4096).unwrap().unwrap()[..7] == data[..7]);

    let contains = |hay: &[u8], nd: &[u8]| hay.windows(nd.len()).any(|w| w == nd);
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(contains(&cmdline, b"--daemon-child"), "wrong process");
    assert!(!contains(&cmdline, PASS) && !contains(&environ, PASS));
    assert!(!contains(&cmdline, &key[..16]) && !contains(&environ, &key[..16]));

    let status = ok(&run_in(
        bin(),
        &["status", "vol", "--run-dir", &run_dir],
        b"",
    ));
    assert!(status.contains("is active"), "{status}");
    let ctl = std::os::unix::net::UnixStream::connect(format!("{run_dir}/vol.ctl")).unwrap();
    let v: serde_json::Value = {
        use std::io::{BufRead, Write};
        (&ctl).write_all(b"status\n").unwrap();
        let mut l = String::new();
        std::io::BufReader::new(&ctl).read_line(&mut l).unwrap();
        serde_json::from_str(&l).unwrap()
    };
    assert_eq!(v["dumpable"], false, "{v}");

    // The volume key: found (else the scan proves nothing), and only in mlocked pages.
    let halves: Vec<&[u8]> = key.chunks(16).collect();
    let found = scan(pid, &halves);
    eprintln!("volume key pieces in the server: {found:x?}");
    assert!(!found.is_empty(), "the scan did not find the volume key");
    let loose: Vec<_> = found.iter().filter(|(_, l)| !l).collect();
    assert!(
        loose.is_empty(),
        "volume key outside mlocked memory: {loose:x?}"
    );
    // The passphrase was only needed to unlock: no copy is left anywhere.
    let pass_found = scan(pid, &[PASS]);
    assert!(
        pass_found.is_empty(),
        "passphrase still in server memory: {pass_found:x?}"
    );

    c.disconnect();
    ok(&run_in(
        bin(),
        &["close", "vol", "--run-dir", &run_dir],
        b"",
    ));
}
