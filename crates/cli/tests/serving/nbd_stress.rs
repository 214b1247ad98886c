//! `open --nbd` under hostile conditions, with a minimal NBD client of our own so the test
//! controls every byte: several connections writing overlapping ranges against a model,
//! clients vanishing in the middle of a request, and a backing filesystem that fills up.

use crate::common::nbd::{CMD_READ, CMD_WRITE, NbdClient};
use crate::common::{bin, ok, run_in, tool};
use std::io::Write;
use std::path::Path;
use std::process::Output;

fn run(cmd: &str, args: &[&str]) -> Output {
    run_in(cmd, args, b"")
}

const ENOSPC: u32 = 28;

/// The shared test client, with a failed connection a panic and a reply its NBD error code.
struct Client(NbdClient);

impl Client {
    fn connect(sock: &str, export: &str) -> Client {
        Client(NbdClient::connect(sock, export).unwrap())
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.0.write(offset, data).unwrap().err().unwrap_or(0)
    }
    fn read(&mut self, offset: u64, len: usize) -> Result<Vec<u8>, u32> {
        self.0.read(offset, len).unwrap()
    }
    fn flush(&mut self) -> u32 {
        self.0.flush().unwrap().err().unwrap_or(0)
    }
    fn disconnect(self) {
        self.0.disconnect()
    }
}

/// For the tests that send parts of requests by hand (`header`, `s`) and read `size`.
impl std::ops::Deref for Client {
    type Target = NbdClient;
    fn deref(&self) -> &NbdClient {
        &self.0
    }
}

impl std::ops::DerefMut for Client {
    fn deref_mut(&mut self) -> &mut NbdClient {
        &mut self.0
    }
}

struct Served {
    dir: tempfile::TempDir,
}

impl Served {
    fn p(&self, f: &str) -> String {
        self.dir.path().join(f).to_str().unwrap().to_string()
    }
    /// Formats `img` (LUKS2, given sector size) and serves it with `--daemon`.
    fn start(img: &str, size: u64, sector: &str, dir: tempfile::TempDir) -> Served {
        let s = Served { dir };
        std::fs::write(s.p("pw"), b"stress passphrase").unwrap();
        std::fs::File::create(img).unwrap().set_len(size).unwrap();
        let pw = s.p("pw");
        ok(&run(
            bin(),
            &[
                "format",
                "-q",
                "--type",
                "luks2",
                "--sector-size",
                sector,
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
                &pw,
                img,
            ],
        ));
        let (sock, run_dir) = (format!("unix:{}", s.p("s.sock")), s.p("run"));
        ok(&run(
            bin(),
            &[
                "open",
                img,
                "vol",
                "--nbd",
                &sock,
                "--daemon",
                "--run-dir",
                &run_dir,
                "--key-file",
                &pw,
            ],
        ));
        s
    }
    fn sock(&self) -> String {
        self.p("s.sock")
    }
    fn status(&self) -> String {
        ok(&run(bin(), &["status", "vol", "--run-dir", &self.p("run")]))
    }
    fn close(&self) {
        ok(&run(bin(), &["close", "vol", "--run-dir", &self.p("run")]));
    }
}

/// Deterministic bytes for (writer, round, write), different for every writer.
fn pattern(w: usize, round: usize, k: usize, len: usize) -> Vec<u8> {
    let mut x = ((w as u64 + 1) * 0x9E37_79B9_7F4A_7C15) ^ (((round * 64 + k) as u64) << 17);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn connections_writing_overlapping_ranges_match_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img").to_str().unwrap().to_string();
    let s = Served::start(&img, 40 << 20, "4096", dir);
    const WRITERS: usize = 4;
    const ROUNDS: usize = 6;
    let size = Client::connect(&s.sock(), "vol").size as usize;
    let window = 256 << 10; // all writers crowd into 256 KiB, so they overlap a lot
    let mut model = Client::connect(&s.sock(), "vol").read(0, window).unwrap();
    assert!(size > window);
    let mut clients: Vec<Client> = (0..WRITERS)
        .map(|_| Client::connect(&s.sock(), "vol"))
        .collect();
    for round in 0..ROUNDS {
        // Each writer's requests for this round: aligned and unaligned, 1 B to 64 KiB.
        let plans: Vec<Vec<(usize, Vec<u8>)>> = (0..WRITERS)
            .map(|w| {
                (0..12)
                    .map(|k| {
                        let seed = pattern(w, round, k, 8);
                        let aligned = k % 3 != 0;
                        let len = if aligned {
                            4096 * (1 + seed[0] as usize % 16)
                        } else {
                            1 + (u16::from_le_bytes([seed[1], seed[2]]) as usize % 20000)
                        };
                        let mut off = u32::from_le_bytes(seed[3..7].try_into().unwrap()) as usize
                            % (window - len);
                        if aligned {
                            off -= off % 4096;
                        }
                        (off, pattern(w, round, k + 100, len))
                    })
                    .collect()
            })
            .collect();
        std::thread::scope(|sc| {
            for (c, plan) in clients.iter_mut().zip(&plans) {
                sc.spawn(move || {
                    for (off, data) in plan {
                        assert_eq!(c.write(*off as u64, data), 0);
                    }
                    assert_eq!(c.flush(), 0);
                });
            }
        });
        // A byte written in this round by one writer must hold that writer's value; by
        // several, one of theirs (concurrent writes to the same place may land in any
        // order); by none, what it held before.
        let got = clients[0].read(0, window).unwrap();
        // Requests on one connection are sequential: only each writer's last write to a
        // byte counts for it.
        let mut candidates: Vec<Vec<u8>> = vec![Vec::new(); window];
        for plan in &plans {
            let mut last: Vec<Option<u8>> = vec![None; window];
            for (off, data) in plan {
                for (i, b) in data.iter().enumerate() {
                    last[off + i] = Some(*b);
                }
            }
            for (i, b) in last.into_iter().enumerate() {
                candidates[i].extend(b);
            }
        }
        let mut contested = 0;
        for i in 0..window {
            let c = &candidates[i];
            if c.is_empty() {
                assert_eq!(
                    got[i], model[i],
                    "round {round}: untouched byte {i} changed"
                );
            } else {
                assert!(
                    c.contains(&got[i]),
                    "round {round}: byte {i} holds {} not written",
                    got[i]
                );
                contested += usize::from(c.len() > 1);
            }
        }
        assert!(contested > 0, "the plan must make writers overlap");
        model = got;
    }
    for c in clients {
        c.disconnect();
    }
    s.close();
    // What the model says is what the image holds, read again after close.
    let back = dir_export(&s, &img, window);
    assert!(back == model);
}

fn dir_export(s: &Served, img: &str, len: usize) -> Vec<u8> {
    let out = s.p("export.raw");
    ok(&run(
        bin(),
        &[
            "export",
            "--key-file",
            &s.p("pw"),
            "--length",
            &len.to_string(),
            img,
            &out,
        ],
    ));
    std::fs::read(out).unwrap()
}

#[test]
fn clients_vanishing_mid_request_leave_the_server_and_data_intact() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img").to_str().unwrap().to_string();
    let s = Served::start(&img, 64 << 20, "512", dir);
    let mut c = Client::connect(&s.sock(), "vol");
    let base = pattern(9, 9, 9, 2 << 20);
    assert_eq!(c.write(0, &base), 0);
    assert_eq!(c.flush(), 0);
    for _ in 0..20 {
        // A write whose payload stops halfway.
        let mut v = Client::connect(&s.sock(), "vol");
        let mut req = v.header(CMD_WRITE, 0, 1 << 20);
        req.extend_from_slice(&[0xEE; 300_000]);
        v.s.write_all(&req).unwrap();
        drop(v);
        // A large read whose reply nobody reads.
        let mut v = Client::connect(&s.sock(), "vol");
        let h = v.header(CMD_READ, 0, 16 << 20);
        v.s.write_all(&h).unwrap();
        drop(v);
        // A header cut short.
        let mut v = Client::connect(&s.sock(), "vol");
        let h = v.header(CMD_WRITE, 0, 4096);
        v.s.write_all(&h[..11]).unwrap();
        drop(v);
    }
    // The half-sent write was never applied; the server still answers everyone.
    assert!(c.read(0, base.len()).unwrap() == base);
    let st = s.status();
    assert!(st.contains("is active"), "{st}");
    c.disconnect();
    s.close();
}

/// A tmpfs of `mb` MiB mounted on `dir`, unmounted on drop.
struct SmallFs(String);
impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = run(&tool("umount", "mount"), &["-l", &self.0]);
    }
}

#[test]
fn full_backing_filesystem_is_enospc_for_the_client_and_the_server_stays_up() {
    let dir = tempfile::tempdir().unwrap();
    let fs_dir = dir.path().join("small");
    std::fs::create_dir(&fs_dir).unwrap();
    let fsp = fs_dir.to_str().unwrap().to_string();
    ok(&run(
        &tool("mount", "mount"),
        &["-t", "tmpfs", "-o", "size=24m", "tmpfs", &fsp],
    ));
    let _guard = SmallFs(fsp.clone());
    // A sparse 64 MiB image on a 24 MiB file system: it fills up long before its end.
    let img = format!("{fsp}/v.img");
    let filler = format!("{fsp}/filler");
    std::fs::write(&filler, vec![1u8; 4 << 20]).unwrap();
    let s = Served::start(&img, 64 << 20, "4096", dir);
    let mut c = Client::connect(&s.sock(), "vol");
    let chunk = pattern(1, 1, 1, 1 << 20);
    let mut written = 0u64;
    let err = loop {
        let e = c.write(written, &chunk);
        if e != 0 {
            break e;
        }
        written += chunk.len() as u64;
        assert!(written < c.size, "the small file system never filled up");
    };
    assert_eq!(
        err, ENOSPC,
        "a full backing file system is ENOSPC for the client"
    );
    // The connection and the server stay up; what was acknowledged reads back.
    assert!(written >= 1 << 20);
    assert!(c.read(0, chunk.len()).unwrap() == chunk);
    assert!(c.read(written - chunk.len() as u64, chunk.len()).unwrap() == chunk);
    let mut other = Client::connect(&s.sock(), "vol");
    assert!(other.read(0, 4096).is_ok());
    assert!(s.status().contains("is active"));
    // Once there is room again, the same write goes through.
    std::fs::remove_file(&filler).unwrap();
    assert_eq!(c.write(written, &chunk), 0);
    assert_eq!(c.flush(), 0);
    assert!(c.read(written, chunk.len()).unwrap() == chunk);
    other.disconnect();
    c.disconnect();
    s.close();
    assert!(Path::new(&img).exists());
}

#[test]
fn backing_file_too_small_is_refused_clearly_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    std::fs::write(p("pw"), b"small").unwrap();
    let img = p("v.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(40 << 20)
        .unwrap();
    ok(&run(
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
            "--key-file",
            &p("pw"),
            &img,
        ],
    ));
    // Cut inside the header area, and exactly at the start of the data segment.
    for (len, says) in [(10u64 << 20, "truncated"), (16 << 20, "too small")] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&img)
            .unwrap()
            .set_len(len)
            .unwrap();
        let before = std::fs::read(&img).unwrap();
        let o = run(
            bin(),
            &[
                "open",
                &img,
                "vol",
                "--nbd",
                &format!("unix:{}", p("s.sock")),
                "--run-dir",
                &p("run"),
                "--key-file",
                &p("pw"),
            ],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(says), "{len}: {err}");
        assert!(
            std::fs::read(&img).unwrap() == before,
            "open wrote to the image"
        );
        assert!(!Path::new(&p("s.sock")).exists());
    }
}
