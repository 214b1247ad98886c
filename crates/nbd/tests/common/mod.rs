//! A minimal NBD client for the integration tests: fixed newstyle, NBD_OPT_EXPORT_NAME,
//! simple replies; requests can be pipelined (send several, then collect the replies).

#![allow(dead_code)] // each test file uses a different subset

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cryptblk_crypto::{CipherSpec, IvOptions};
use cryptblk_nbd::proto::*;
use cryptblk_nbd::{NbdServer, ShutdownHandle};
use cryptblk_volume::VolumeParams;

/// A server on a unix socket in a temporary directory, serving on a thread of its own.
pub(crate) struct Serving {
    pub path: PathBuf,
    pub handle: ShutdownHandle,
    thread: JoinHandle<io::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Serving {
    pub(crate) fn start(server: NbdServer) -> Serving {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nbd.sock");
        let handle = server.shutdown_handle();
        let p = path.clone();
        let thread = std::thread::spawn(move || server.serve_unix(&p));
        wait_for_socket(&path);
        Serving {
            path,
            handle,
            thread,
            _dir: dir,
        }
    }

    /// Shuts the server down, waits for it to return (it must succeed), and hands back
    /// the handle (its stats stay readable; it holds the last references to the exports).
    pub(crate) fn stop(self) -> ShutdownHandle {
        self.handle.shutdown();
        self.thread.join().unwrap().unwrap();
        self.handle
    }
}

/// aes-xts-plain64 on 4096-byte sectors (IVs counted in 4096-byte units), read-write, no
/// discards: the data path's common case.
pub(crate) fn xts_4096_params(data_offset: u64) -> VolumeParams {
    VolumeParams {
        cipher: CipherSpec::parse("aes-xts-plain64").unwrap(),
        sector_size: 4096,
        iv: IvOptions {
            large_sectors: true,
            offset: 0,
        },
        data_offset,
        data_length: None,
        read_only: false,
        allow_discards: false,
    }
}

pub(crate) struct Client {
    pub s: UnixStream,
    pub size: u64,
    cookie: u64,
}

pub(crate) fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < deadline, "server socket never appeared");
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Client {
    pub(crate) fn connect(path: &Path) -> Client {
        let mut s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..8], b"NBDMAGIC");
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        let mut opt = IHAVEOPT.to_be_bytes().to_vec();
        opt.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
        opt.extend_from_slice(&0u32.to_be_bytes()); // default export
        s.write_all(&opt).unwrap();
        let mut info = [0u8; 10];
        s.read_exact(&mut info).unwrap();
        let size = u64::from_be_bytes(info[..8].try_into().unwrap());
        Client { s, size, cookie: 0 }
    }

    /// Sends one request (and its payload); returns its cookie.
    pub(crate) fn send(&mut self, typ: u16, offset: u64, len: u32, payload: &[u8]) -> u64 {
        self.cookie += 1;
        let r = Request {
            magic: REQUEST_MAGIC,
            flags: 0,
            typ,
            cookie: self.cookie,
            offset,
            len,
        };
        self.s.write_all(&r.encode()).unwrap();
        self.s.write_all(payload).unwrap();
        self.cookie
    }

    /// Reads one simple reply header: (error, cookie).
    pub(crate) fn reply(&mut self) -> (u32, u64) {
        let mut r = [0u8; 16];
        self.s.read_exact(&mut r).unwrap();
        assert_eq!(
            u32::from_be_bytes(r[..4].try_into().unwrap()),
            SIMPLE_REPLY_MAGIC
        );
        (
            u32::from_be_bytes(r[4..8].try_into().unwrap()),
            u64::from_be_bytes(r[8..].try_into().unwrap()),
        )
    }

    /// One write, waiting for its reply: the NBD error (0 = success).
    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        let c = self.send(CMD_WRITE, offset, data.len() as u32, data);
        let (err, cookie) = self.reply();
        assert_eq!(cookie, c);
        err
    }

    pub(crate) fn read(&mut self, offset: u64, len: usize) -> Result<Vec<u8>, u32> {
        let c = self.send(CMD_READ, offset, len as u32, &[]);
        let (err, cookie) = self.reply();
        assert_eq!(cookie, c);
        if err != 0 {
            return Err(err);
        }
        let mut b = vec![0u8; len];
        self.s.read_exact(&mut b).unwrap();
        Ok(b)
    }

    pub(crate) fn flush(&mut self) -> u32 {
        let c = self.send(CMD_FLUSH, 0, 0, &[]);
        let (err, cookie) = self.reply();
        assert_eq!(cookie, c);
        err
    }

    pub(crate) fn disconnect(mut self) {
        self.send(CMD_DISC, 0, 0, &[]);
    }
}

/// The path of `name` in PATH; a missing tool fails the test, naming its package.
pub(crate) fn tool(name: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "`{name}` not found in PATH: install the Debian package `{package}` (apt-get install {package})"
    );
}

/// Runs `cmd`, which must succeed (its output is shown when it does not).
pub(crate) fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A server process (qemu-nbd, nbdkit), killed when dropped.
pub(crate) struct External {
    pub child: Child,
}

impl Drop for External {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `cmd` (a server that creates the unix socket `sock`) and waits for the socket.
pub(crate) fn spawn_on_socket(cmd: &mut Command, sock: &Path) -> External {
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut ext = External { child };
    let deadline = Instant::now() + Duration::from_secs(10);
    // The socket file appears before the server listens on it: wait until it answers
    // (the servers here take a client that leaves at once).
    while std::os::unix::net::UnixStream::connect(sock).is_err() {
        if let Ok(Some(st)) = ext.child.try_wait() {
            panic!(
                "{cmd:?} exited ({st}) before listening on {}",
                sock.display()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{cmd:?}: not listening after 10 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    ext
}

/// qemu-nbd serving the raw `file` on `sock` (8 clients, write-back cache), with `extra`
/// arguments (TLS objects) before the file.
pub(crate) fn qemu_nbd_with(file: &Path, sock: &Path, extra: &[String]) -> External {
    let mut cmd = Command::new(tool("qemu-nbd", "qemu-utils"));
    cmd.args([
        "--format",
        "raw",
        "--persistent",
        "--shared",
        "8",
        "--cache",
        "writeback",
    ])
    .arg("--socket")
    .arg(sock)
    .args(extra)
    .arg(file);
    spawn_on_socket(&mut cmd, sock)
}

pub(crate) fn qemu_nbd(file: &Path, sock: &Path) -> External {
    qemu_nbd_with(file, sock, &[])
}

/// nbdkit's file plugin serving `file` on `sock`, with `extra` arguments (`--tls=...`).
pub(crate) fn nbdkit_with(file: &Path, sock: &Path, extra: &[String]) -> External {
    let mut cmd = Command::new(tool("nbdkit", "nbdkit"));
    cmd.args(["--foreground", "--exit-with-parent", "--unix"])
        .arg(sock)
        .args(extra)
        .arg("file")
        .arg(format!("file={}", file.display()));
    spawn_on_socket(&mut cmd, sock)
}

pub(crate) fn nbdkit(file: &Path, sock: &Path) -> External {
    nbdkit_with(file, sock, &[])
}
