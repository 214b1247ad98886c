//! Serving an unlocked volume: one lifecycle for every frontend (NBD, FUSE, ublk, and the
//! ones to come), each of which is one file here implementing [`Frontend`] (and, if its
//! server can leave kernel state behind when killed, [`Leftovers`]).
//!
//! The lifecycle ([`open`]), one function per step: claim the name and check the options
//! and what the frontend needs, detach (`--daemon`), unlock the volume, start the
//! frontend, announce it in the run directory (control socket NAME.ctl, NAME.pid, signal
//! handlers), answer the control socket, run until closed, flush, clean up.

mod fuse;
mod nbd;
mod online;
mod shutdown;
mod suspend;
pub(crate) mod ublk;
mod vhost_user_blk;

use crate::args::VolumeArgs;
use crate::control::{Reply, Request};
use crate::ctx::Ctx;
use crate::error::{CliError, CliResult, EXIT_BUSY, EXIT_NO_DEVICE, EXIT_USAGE, io_err};
use crate::rundir::{self, SocketAccess};
use crate::unlock::open_volume;
use clap::Args;
use cryptblk_device::BlockDevice;
use cryptblk_volume::Volume;
use cryptblk_volume::{Opened, VolumeInfo};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Args, Debug)]
pub(crate) struct OpenArgs {
    /// Image file, block device, or `mem:SIZE` (RAM, e.g. mem:1G; plain mode, for benchmarks).
    pub device: PathBuf,
    /// Name of the mapping (used by close/status).
    #[arg(required_unless_present_any = ["test_passphrase", "crypttab"], default_value = "")]
    pub name: String,
    /// Open the entry of this crypttab(5) file named by the one argument (`open --crypttab
    /// FILE NAME`): its device, key file and options; options given here as well win.
    #[arg(long, value_name = "FILE")]
    pub crypttab: Option<PathBuf>,
    /// Only check the passphrase (cryptsetup's `open --test-passphrase`): nothing is served.
    #[arg(long = "test-passphrase")]
    pub test_passphrase: bool,
    /// Serve over NBD: `unix:PATH` or `tcp:127.0.0.1:PORT`.
    #[arg(long, conflicts_with = "fuse")]
    pub nbd: Option<String>,
    /// Serve as the file DIR/NAME in a FUSE mount on DIR (loop-mount it, or use it directly).
    #[arg(long, value_name = "DIR")]
    pub fuse: Option<PathBuf>,
    /// With --fuse: let other users (root included) reach the file; its permissions
    /// (0600, the server's user) still apply, checked by the kernel.
    #[arg(long = "allow-other", requires = "fuse")]
    pub allow_other: bool,
    /// Serve to a virtual machine as a virtio-blk disk over the vhost-user socket SOCKET
    /// (QEMU: `-chardev socket,id=c,path=SOCKET,reconnect=1 -device
    /// vhost-user-blk-pci,chardev=c` with guest memory shared, e.g.
    /// `memory-backend-memfd,share=on`). One queue per CPU unless --queues.
    #[arg(long = "vhost-user-blk", value_name = "SOCKET")]
    pub vhost_user_blk: Option<PathBuf>,
    /// With --nbd unix:PATH or --vhost-user-blk: permissions of the socket (octal;
    /// default 600, owner only). Whoever can connect reads and writes the plaintext.
    #[arg(long = "socket-mode", value_name = "OCTAL")]
    pub socket_mode: Option<String>,
    /// With --nbd unix:PATH or --vhost-user-blk: group of the socket (name or number), to
    /// share it on purpose together with --socket-mode 660.
    #[arg(long = "socket-group", value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// With --nbd: TLS for clients (NBD_OPT_STARTTLS, X.509): `required` (the default when
    /// --tls-cert is given) serves only clients that switch to TLS, `optional` serves both,
    /// `off` none.
    #[arg(long, value_enum, value_name = "MODE", requires = "nbd")]
    pub tls: Option<nbd::TlsArg>,
    /// With --nbd: the server's TLS certificate chain (PEM, its own certificate first).
    #[arg(long = "tls-cert", value_name = "PEM", requires = "nbd")]
    pub tls_cert: Option<PathBuf>,
    /// With --tls-cert: the server's private key (PEM; keep it readable by its user only).
    #[arg(long = "tls-key", value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// With --tls-cert: clients must present a certificate signed by a CA in this file (PEM).
    /// Required on a non-loopback address (see --tls-no-client-auth).
    #[arg(long = "tls-ca", value_name = "PEM", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// With --tls-cert on a non-loopback address: serve TLS clients without checking who
    /// they are (no --tls-ca). The wire is encrypted, but anyone who can connect reads and
    /// writes the plaintext.
    #[arg(
        long = "tls-no-client-auth",
        requires = "tls_cert",
        conflicts_with = "tls_ca"
    )]
    pub tls_no_client_auth: bool,
    /// With --nbd tcp:ADDR: allow a non-loopback address without --tls required. Anyone
    /// who can reach the port then reads and writes the plaintext.
    #[arg(long = "insecure-listen", requires = "nbd")]
    pub insecure_listen: bool,
    /// Detach and run in the background once ready.
    #[arg(long)]
    pub daemon: bool,
    /// Serve Prometheus metrics at GET /metrics: `unix:PATH` (0600) or
    /// `tcp:127.0.0.1:PORT` (loopback only): requests, bytes, errors and latency per
    /// operation, requests in flight, clients, integrity failures, reencryption progress.
    #[arg(long, value_name = "unix:PATH|tcp:127.0.0.1:PORT")]
    pub metrics: Option<String>,
    /// cryptsetup's --shared: serve another range (--offset, --size) of a device that
    /// another volume already holds, without the lock or exclusive open that otherwise
    /// keeps a device to one server; keeping the ranges apart is the user's part.
    #[arg(long)]
    pub shared: bool,
    /// Directory for pid, control socket and log (default: $XDG_RUNTIME_DIR/cryptblk,
    /// /run/cryptblk as root, else $TMPDIR/cryptblk-UID); kept private (0700).
    #[arg(long = "run-dir")]
    pub run_dir: Option<PathBuf>,
    /// NBD: threads per connection (requests in flight per client); FUSE: worker threads.
    /// Default 4, or 16 when the DEVICE is remote (an NBD export, an RBD image), whose
    /// latency takes more requests in flight to hide.
    #[arg(long)]
    pub threads: Option<usize>,
    /// NBD: microseconds a connection polls for its next request before sleeping;
    /// vhost-user-blk: the same for a queue's ring (0 = never poll; polling saves a
    /// wake-up per request at low queue depth).
    #[arg(long = "busy-poll", value_name = "MICROS", default_value_t = 50)]
    pub busy_poll: u64,
    /// Seconds a stopping server (SIGTERM, `close`) has to drain its clients, flush and
    /// close its storage. Past them it exits with code 4 without: storage that hangs
    /// (a cluster down, a remote NBD server stopped) cannot keep it from exiting.
    #[arg(long = "close-timeout", value_name = "SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub close_timeout: u64,
    #[command(flatten)]
    pub ublk: ublk::UblkArgs,
    /// Internal: set in the detached child of `--daemon`.
    #[arg(long = "daemon-child", hide = true)]
    pub daemon_child: bool,
    #[command(flatten)]
    pub vol: VolumeArgs,
}

impl OpenArgs {
    /// Threads per NBD connection or FUSE workers: `--threads`, else by where the data is.
    pub(crate) fn threads(&self) -> usize {
        self.threads
            .unwrap_or(if cryptblk_storage::is_remote(&self.device) {
                16
            } else {
                4
            })
    }
}

/// A way to serve a volume. `prepare` runs before anything is unlocked or the process
/// detaches; `start` makes the volume reachable.
pub(crate) trait Frontend {
    /// Checks options and what the host must offer (kernel driver...), so that errors come
    /// before the passphrase is asked for. Runs in the `--daemon` parent and child alike.
    fn prepare(&mut self, _a: &OpenArgs, _dir: &Path) -> CliResult<()> {
        Ok(())
    }
    /// Serves `vol` (bound, mounted or created): clients may come once this returns.
    fn start(
        self: Box<Self>,
        a: &OpenArgs,
        dir: &Path,
        vol: Arc<Volume>,
        info: &VolumeInfo,
    ) -> CliResult<Started>;
}

/// What a frontend's server can leave behind when it dies without closing (a kernel
/// device): `close` removes it, `status` explains it. A frontend with such state adds its
/// [`Leftovers`] to [`LEFTOVERS`].
pub(crate) trait Leftovers: Sync {
    /// Removes what the dead server of `name` left; `None` when it left nothing.
    fn close_stale(&self, dir: &Path, name: &str) -> Option<CliResult<()>>;
    /// What `status` says about it; `None` when it left nothing.
    fn stale_status(&self, dir: &Path, name: &str) -> Option<String>;
}

/// Every frontend's leftovers (NBD and FUSE leave none: their sockets and mounts go with
/// the process).
const LEFTOVERS: &[&dyn Leftovers] = &[&ublk::UblkLeftovers];

/// Removes what the dead server of `name` left behind, if anything did.
pub(crate) fn close_stale(dir: &Path, name: &str) -> Option<CliResult<()>> {
    LEFTOVERS.iter().find_map(|l| l.close_stale(dir, name))
}

/// What the dead server of `name` left behind, as `status` reports it.
pub(crate) fn stale_status(dir: &Path, name: &str) -> Option<String> {
    LEFTOVERS.iter().find_map(|l| l.stale_status(dir, name))
}

/// A frontend that serves.
pub(crate) struct Started {
    /// `status`'s frontend field: "nbd unix:PATH", "fuse FILE", "ublk".
    pub(crate) desc: String,
    /// Where it is served, for the message at start ("unix:PATH", "/dev/ublkb0 (...)").
    pub(crate) summary: String,
    /// A device node to print on stdout once ready (and hand to the `--daemon` parent).
    pub(crate) device_node: Option<String>,
    /// Stop requests and figures, from the signal and control threads.
    pub(crate) control: Arc<dyn Control>,
    /// Serves until stopped, then removes what the frontend made.
    pub(crate) run: Box<dyn FnOnce() -> CliResult<()>>,
}

/// The frontend as `close`, signals and `status` reach it while it runs.
pub(crate) trait Control: Send + Sync {
    /// Starts a clean stop (drain, then `run` returns); a frontend that is still in use
    /// (a FUSE file held open) may refuse: `Err(why)`.
    fn stop(&self) -> Result<(), String>;
    /// The frontend's own fields of `status` (a JSON object).
    fn status(&self) -> Value;
    /// Whether the volume's size may change under this frontend (`resize`): NBD clients
    /// that connect later and the FUSE file (its attributes live one second) see the new
    /// size; a frontend whose kernel device cannot change size says why not.
    fn can_resize(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The frontend the options name: exactly one of --nbd, --fuse, --ublk, --vhost-user-blk.
fn choose(a: &OpenArgs) -> CliResult<Box<dyn Frontend>> {
    let named = [
        a.nbd.is_some(),
        a.fuse.is_some(),
        a.ublk.ublk,
        a.vhost_user_blk.is_some(),
    ];
    match named.iter().filter(|&&n| n).count() {
        0 => {
            return Err(CliError::usage(
                "open needs one frontend: --nbd unix:PATH, --nbd tcp:127.0.0.1:PORT, --fuse DIR, \
                 --ublk or --vhost-user-blk SOCKET",
            ));
        }
        1 => {}
        _ => {
            return Err(CliError::usage(
                "choose one frontend: --nbd, --fuse, --ublk or --vhost-user-blk",
            ));
        }
    }
    let on_socket = a.nbd.is_some() || a.vhost_user_blk.is_some();
    if !on_socket && (a.socket_mode.is_some() || a.socket_group.is_some()) {
        return Err(CliError::usage(
            "--socket-mode and --socket-group need --nbd unix:PATH or --vhost-user-blk",
        ));
    }
    if let Some(spec) = &a.nbd {
        ublk::check_unused(&a.ublk, false)?;
        return Ok(Box::new(nbd::NbdFrontend::parse(spec, a)?));
    }
    if let Some(mnt) = &a.fuse {
        ublk::check_unused(&a.ublk, false)?;
        return Ok(Box::new(fuse::FuseFrontend::new(mnt.clone())));
    }
    if let Some(socket) = &a.vhost_user_blk {
        ublk::check_unused(&a.ublk, true)?;
        return Ok(Box::new(vhost_user_blk::VhostUserBlkFrontend::parse(
            socket, a,
        )?));
    }
    Ok(Box::new(ublk::UblkFrontend::default()))
}

/// `open`: the whole lifecycle, for whichever frontend the options name, as its steps:
/// [`claim`] (checks, run directory, the name, the frontend's own checks; `--daemon`
/// detaches after it), [`unlock`], [`Serving::start`], [`Serving::announce`] (control
/// socket, pid file, signals), [`Serving::say_ready`], [`Serving::run_and_close`].
pub(crate) fn open(ctx: &Ctx, mut a: OpenArgs) -> CliResult<()> {
    let crypttab_ctx;
    let ctx = if let Some(file) = a.crypttab.clone() {
        crypttab_ctx = from_crypttab(ctx, &file, &mut a)?;
        &crypttab_ctx
    } else {
        ctx
    };
    let shared_ctx;
    let ctx = if a.shared {
        shared_ctx = Ctx {
            batch: ctx.batch,
            verbose: ctx.verbose,
            dropin: ctx.dropin,
            program: ctx.program,
            devices: cryptblk_storage::Devices {
                shared_local: true,
                ..ctx.devices.clone()
            },
            tries: ctx.tries,
            tries_given: ctx.tries_given,
        };
        &shared_ctx
    } else {
        ctx
    };
    // From here on this process holds the passphrase and the volume key: no core dumps,
    // no ptrace attach and no /proc/PID/mem for other (non-root) users. execve resets the
    // flag, so the `--daemon` child, which runs this function too, sets it again itself.
    crate::process::set_not_dumpable();
    if a.test_passphrase {
        return test_passphrase(ctx, a);
    }
    if ctx.dropin && !a.daemon_child {
        // cryptsetup's `open` returns once the mapping exists: the drop-in returns once
        // the volume is served. With no frontend named, it is served over NBD on a
        // socket in the private run directory; the message says where.
        a.daemon = true;
        if a.nbd.is_none() && a.fuse.is_none() && !a.ublk.ublk && a.vhost_user_blk.is_none() {
            let dir = rundir::private_run_dir(&a.run_dir)?;
            rundir::check_name(&a.name)?;
            a.nbd = Some(format!(
                "unix:{}",
                dir.join(format!("{}.nbd", a.name)).display()
            ));
        }
    }
    let claimed = claim(&mut a)?;
    if a.daemon && !a.daemon_child {
        // The child claims the name itself (if another `open` takes it in between, the
        // child says so and this process reports it).
        drop(claimed.name);
        return spawn_daemon(ctx, &a, &claimed.dir);
    }
    crate::notify::notify(&format!(
        "STATUS={}",
        crate::notify::status_line(&format!("Unlocking {} ({})", a.name, a.device.display()))
    ));
    let unlocked = unlock(ctx, &a)?;
    // Bound before the frontend starts: a taken port fails the open before anything is
    // served (and after the unlock: a wrong passphrase leaves no socket behind).
    let metrics = a
        .metrics
        .as_deref()
        .map(crate::metrics::Listener::bind)
        .transpose()?;
    let serving = Serving::start(&a, claimed, unlocked)?;
    serving.announce()?;
    let metrics_path = metrics.as_ref().and_then(crate::metrics::Listener::path);
    if let Some(m) = metrics {
        serving.serve_metrics(m, ctx, &a);
    }
    serving.say_ready(ctx, &a);
    let r = serving.run_and_close(&a);
    if let Some(p) = metrics_path {
        let _ = std::fs::remove_file(p);
    }
    r
}

/// `open --crypttab FILE NAME`: NAME's line applied to `a` (the one positional argument,
/// parsed as DEVICE, is NAME). With no frontend in the line or on the command line, the
/// volume is served over NBD on NAME.nbd in the private run directory, as the drop-in's.
fn from_crypttab(ctx: &Ctx, file: &Path, a: &mut OpenArgs) -> CliResult<Ctx> {
    if !a.name.is_empty() {
        return Err(CliError::usage(
            "with --crypttab FILE, give only the entry's NAME (its line names the device)",
        ));
    }
    let name = a.device.to_string_lossy().into_owned();
    let entry = crate::crypttab::find(file, &name)?;
    let tries = crate::crypttab::apply(&entry, file, a)?;
    rundir::check_name(&a.name)?;
    if a.nbd.is_none() && a.fuse.is_none() && !a.ublk.ublk && a.vhost_user_blk.is_none() {
        let dir = rundir::private_run_dir(&a.run_dir)?;
        a.nbd = Some(format!(
            "unix:{}",
            dir.join(format!("{}.nbd", a.name)).display()
        ));
    }
    Ok(Ctx {
        tries: match tries {
            Some(t) if !ctx.tries_given => t,
            _ => ctx.tries,
        },
        ..ctx.clone()
    })
}

/// `open --test-passphrase`: `test-passphrase` with the same options.
fn test_passphrase(ctx: &Ctx, a: OpenArgs) -> CliResult<()> {
    let t = crate::commands::keyslots::TestArgs {
        device: a.device,
        volume_key_file: a.vol.volume_key_file,
        unbound: a.vol.unbound,
        key_size: a.vol.key_size,
        header: a.vol.header,
        key: a.vol.key,
        key_slot: a.vol.key_slot,
        tokens: a.vol.tokens,
        select: crate::args::TypeSelect {
            kind: Some(a.vol.kind),
            tcrypt: a.vol.tcrypt,
            cipher: a.vol.cipher,
            hash: a.vol.hash,
        },
    };
    crate::commands::keyslots::test_passphrase(ctx, t)
}

/// What [`claim`] holds until the process exits.
struct Claimed {
    frontend: Box<dyn Frontend>,
    dir: PathBuf,
    name: rundir::NameClaim,
}

/// Everything checked before a passphrase is asked for: the name, the frontend and what
/// it needs from the host, the private run directory; then the name is claimed, so that a
/// second `open` of it is refused before it serves anything (or leaves a socket behind).
fn claim(a: &mut OpenArgs) -> CliResult<Claimed> {
    rundir::check_name(&a.name)?;
    if a.daemon_child && a.vol.key.key_file().map(|p| p.as_path()) == Some(Path::new("-")) {
        // Our parent skipped --keyfile-offset of its stdin already (see spawn_daemon).
        a.vol.key.keyfile_offset = 0;
    }
    let mut frontend = choose(a)?;
    let dir = rundir::private_run_dir(&a.run_dir)?;
    // The control socket is bound only once the volume is unlocked: a path it cannot
    // have is refused before a passphrase is asked for.
    rundir::check_socket_path_length(&dir.join(format!("{}.ctl", a.name)))?;
    let name = claim_name(&dir, &a.name)?;
    frontend.prepare(a, &dir)?;
    Ok(Claimed {
        frontend,
        dir,
        name,
    })
}

/// The unlocked volume and what serves it besides the frontend.
struct Unlocked {
    vol: Arc<Volume>,
    info: VolumeInfo,
    /// A detached header on a remote store (its own RBD image, with its own lock) is
    /// closed at exit too; an attached one is the volume's own storage.
    header_store: Option<cryptblk_device::DataDevice>,
    suspension: Arc<suspend::SuspendControl>,
    jobs: Arc<online::OnlineJobs>,
}

/// Reads the passphrase or key, unlocks the volume, and readies suspend/resume and online
/// reencryption over it.
fn unlock(ctx: &Ctx, a: &OpenArgs) -> CliResult<Unlocked> {
    let Opened {
        volume,
        info,
        header_file,
    } = open_volume(ctx, &a.device, &a.vol)?;
    check_block_alignment(&a.device, &volume)?;
    let vol = Arc::new(volume);
    let suspension = suspend::SuspendControl::new(vol.clone(), header_file.as_ref(), &a.device)?;
    let header_store = header_file.clone();
    let jobs = online::OnlineJobs::new(vol.clone(), header_file, &a.device);
    Ok(Unlocked {
        vol,
        info,
        header_store,
        suspension,
        jobs,
    })
}

/// A volume being served, from its frontend's start to its last flush.
struct Serving {
    name: String,
    _claim: rundir::NameClaim,
    vol: Arc<Volume>,
    header_store: Option<cryptblk_device::DataDevice>,
    suspension: Arc<suspend::SuspendControl>,
    jobs: Arc<online::OnlineJobs>,
    started: Started,
    served: Arc<Served>,
    ctl_path: PathBuf,
    pid_path: PathBuf,
    files: Arc<shutdown::ExitFiles>,
    /// The accepted `close`'s connection, told how the exit went.
    closer: Arc<shutdown::Closer>,
    /// Bounds the exit once a stop is accepted (`--close-timeout`).
    deadline: shutdown::ShutdownDeadline,
    /// The first accepted stop is final: later ones (a signal during a `close`) are
    /// answered yes and change nothing; a `suspend` waits for a stop in progress and is
    /// refused after it.
    stopping: Arc<Mutex<bool>>,
}

impl Serving {
    /// Starts the frontend: clients may come from here on.
    fn start(a: &OpenArgs, claimed: Claimed, u: Unlocked) -> CliResult<Self> {
        let Claimed {
            frontend,
            dir,
            name: claim,
        } = claimed;
        let started = frontend.start(a, &dir, u.vol.clone(), &u.info)?;
        let served = Arc::new(Served {
            name: a.name.clone(),
            device: a.device.display().to_string(),
            device_id: rundir::identity(&a.device),
            detached_header: a.vol.header.header.is_some(),
            info: u.info,
            frontend: started.desc.clone(),
        });
        let ctl_path = dir.join(format!("{}.ctl", a.name));
        let pid_path = dir.join(format!("{}.pid", a.name));
        let files = shutdown::ExitFiles::new(ctl_path.clone(), pid_path.clone());
        let closer = Arc::new(shutdown::Closer::default());
        let deadline = {
            let (name, files, closer) = (a.name.clone(), files.clone(), closer.clone());
            shutdown::ShutdownDeadline::new(Duration::from_secs(a.close_timeout), move |why| {
                files.remove_ctl();
                files.remove_pid();
                let msg = format!(
                    "{name}: {why}; exiting without (what was not flushed may be lost, and an \
                     RBD image's lock is held until the cluster expires its watch)"
                );
                closer.tell_within(
                    &Reply::Error {
                        code: EXIT_NO_DEVICE,
                        message: msg.clone(),
                    },
                    Duration::from_millis(200),
                );
                shutdown::say_briefly(msg);
                crate::process::exit_now(EXIT_NO_DEVICE);
            })
        };
        Ok(Serving {
            name: a.name.clone(),
            _claim: claim,
            vol: u.vol,
            header_store: u.header_store,
            suspension: u.suspension,
            jobs: u.jobs,
            started,
            served,
            ctl_path,
            pid_path,
            files,
            closer,
            deadline,
            stopping: Arc::new(Mutex::new(false)),
        })
    }

    /// A clean stop, as `close` and signals ask for it: a reencryption in progress stops
    /// (after its step) before the volume closes, and no other starts; a suspended volume
    /// refuses (its held I/O could not drain: luksResume it first). The clock for the
    /// whole exit starts here.
    fn stop_fn(&self) -> impl Fn() -> Result<(), String> + Send + Clone + 'static {
        let (c, jobs, suspension) = (
            self.started.control.clone(),
            self.jobs.clone(),
            self.suspension.clone(),
        );
        let (deadline, stopping) = (self.deadline.clone(), self.stopping.clone());
        let name = self.name.clone();
        move || {
            // Armed before any lock: a `suspend` stuck on storage that hangs (holding
            // them) cannot keep this stop unbounded. Taken back if the stop is refused.
            deadline.arm();
            let mut accepted = stopping.lock().unwrap_or_else(|e| e.into_inner());
            if *accepted {
                return Ok(());
            }
            if suspension.is_suspended() {
                deadline.disarm();
                return Err("the volume is suspended: luksResume it first".to_string());
            }
            // Again: a concurrent stop that was refused meanwhile took the arm back.
            deadline.arm();
            jobs.close();
            match c.stop() {
                Ok(()) => {
                    deadline.commit();
                    *accepted = true;
                    crate::notify::notify(&format!(
                        "STOPPING=1\nSTATUS={}",
                        crate::notify::status_line(&format!(
                            "Closing {name}: draining the clients, flushing"
                        ))
                    ));
                    Ok(())
                }
                Err(e) => {
                    jobs.reopen();
                    deadline.disarm();
                    Err(e)
                }
            }
        }
    }

    /// Makes the volume visible to the other commands: the control socket and pid file,
    /// SIGTERM/SIGINT (stop accepting, drain, flush, exit 0; a busy FUSE file stays up; a
    /// second one during the close exits at once), and the thread answering the socket.
    fn announce(&self) -> CliResult<()> {
        let stop = self.stop_fn();
        let force = {
            let deadline = self.deadline.clone();
            move || deadline.expire_now()
        };
        let ctl = announce(
            &self.ctl_path,
            &self.pid_path,
            &self.name,
            stop.clone(),
            force,
        )?;
        self.files.bound();
        let status = self.status_fn();
        let (c, vol, jobs, suspension, limit, closer, stopping) = (
            self.started.control.clone(),
            self.vol.clone(),
            self.jobs.clone(),
            self.suspension.clone(),
            self.deadline.limit(),
            self.closer.clone(),
            self.stopping.clone(),
        );
        std::thread::spawn(move || {
            let resize = |new: Option<u64>| resize(&vol, &*c, &jobs, &suspension, new);
            let ends = ControlEnds {
                close: stop,
                stopping: &stopping,
                closer: &closer,
                limit,
            };
            control_loop(ctl, status, resize, &jobs, &suspension, ends)
        });
        Ok(())
    }

    /// What `status` answers, as a function the control and metrics threads call.
    fn status_fn(&self) -> impl Fn() -> Value + Send + Sync + 'static {
        let (c, served, vol, jobs, suspension) = (
            self.started.control.clone(),
            self.served.clone(),
            self.vol.clone(),
            self.jobs.clone(),
            self.suspension.clone(),
        );
        move || {
            let mut v = status_json(&served, &vol, &jobs, c.status());
            v["suspended"] = json!(suspension.is_suspended());
            v
        }
    }

    /// Serves `--metrics` (latency timed from now on).
    fn serve_metrics(&self, m: crate::metrics::Listener, ctx: &Ctx, a: &OpenArgs) {
        self.vol.stats().requests.enable();
        if ctx.verbose || !a.daemon_child {
            eprintln!("{}: metrics at {}/metrics", self.name, m.describe());
        }
        let vol = self.vol.clone();
        m.serve(self.status_fn(), move || {
            vol.clone() as Arc<dyn crate::metrics::StatsSource>
        });
    }

    /// Says where the volume is served; a `--daemon` child tells its parent it is ready
    /// ("READY" or "READY /dev/ublkbN"), and the parent exits.
    fn say_ready(&self, ctx: &Ctx, a: &OpenArgs) {
        if ctx.verbose || !a.daemon_child {
            eprintln!(
                "{}: {} {} served at {}",
                self.name,
                self.served.info.kind,
                self.vol.cipher_summary().spec,
                self.started.summary
            );
        }
        let node = self.started.device_node.clone().unwrap_or_default();
        // systemd (Type=notify): the frontend accepts clients from here on.
        crate::notify::notify(&format!(
            "READY=1\nSTATUS={}",
            crate::notify::status_line(&format!(
                "Serving {} at {}",
                self.name, self.started.summary
            ))
        ));
        if a.daemon_child {
            let mut out = std::io::stdout();
            let _ = writeln!(out, "READY {node}").and_then(|_| out.flush());
        } else if !node.is_empty() {
            outln!("{node}");
        }
    }

    /// Serves until stopped (or until the frontend ends on its own: a FUSE file unmounted,
    /// a ublk device deleted), then the last flush, the storage let go, and the `close`
    /// that asked told how it went.
    fn run_and_close(self, a: &OpenArgs) -> CliResult<()> {
        let result = (self.started.run)();
        // Also when the frontend ended on its own (a second STOPPING=1 is harmless).
        crate::notify::notify("STOPPING=1");
        // An end of the frontend's own is bounded all the same, and counts as an
        // accepted stop.
        self.deadline.commit();
        *self.stopping.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.jobs.close();
        self.files.remove_ctl();
        // The last flush, then the storage lets go of what it holds elsewhere (an RBD
        // image's lock and watch): other threads still hold the volume, so it is never
        // dropped. Before the pid file goes (`close` waits for that).
        let closed = self.vol.close();
        let header = self
            .header_store
            .map_or(Ok(()), |h| cryptblk_device::Storage::close(&h));
        self.deadline.done();
        let outcome = closed.and(header).map_err(|e| io_err(&a.device, e));
        self.closer
            .tell(&match outcome.as_ref().and(result.as_ref()) {
                Ok(()) => Reply::Closed,
                Err(e) => Reply::error(e),
            });
        self.files.remove_pid();
        outcome?;
        result
    }
}

/// Everything `status` reports, fixed at open time.
struct Served {
    name: String,
    device: String,
    /// The device's (st_dev, st_ino), by which `reencrypt DEVICE` finds its server.
    device_id: Option<(u64, u64)>,
    /// Opened with `--header`: the device holds no header.
    detached_header: bool,
    info: VolumeInfo,
    frontend: String,
}

/// The volume's part of `status`, with the frontend's fields (`extra`, an object) added.
fn status_json(
    s: &Served,
    vol: &cryptblk_volume::Volume,
    jobs: &online::OnlineJobs,
    extra: Value,
) -> Value {
    let st = vol.stats();
    let c = vol.cipher_summary();
    let (cipher, sector_size, backend) = (c.spec, c.sector_size, c.backend);
    let mut v = json!({
        "name": s.name, "device": s.device, "type": s.info.kind,
        "cipher": cipher, "key_bits": s.info.key_bits, "keyslot": s.info.keyslot, "uuid": s.info.uuid,
        "token": s.info.token.as_ref().map(|(id, kind)| json!({"id": id, "type": kind})),
        "sector_size": sector_size, "backend": backend,
        "storage": vol.storage_description(),
        "offset_sectors": c.data_offset / 512, "size_sectors": vol.size() / 512, "size_bytes": vol.size(),
        "skipped_sectors": c.iv_offset,
        "mode": if vol.read_only() { "readonly" } else { "read/write" },
        "discards": vol.can_discard(),
        "frontend": s.frontend, "pid": std::process::id(),
        "reads": st.reads.load(Relaxed), "writes": st.writes.load(Relaxed),
        "read_bytes": st.read_bytes.load(Relaxed), "written_bytes": st.written_bytes.load(Relaxed),
        "flushes": st.flushes.load(Relaxed), "discards_done": st.discards.load(Relaxed),
        "unaligned": st.unaligned.load(Relaxed), "crypto_calls": st.crypto_calls.load(Relaxed),
        "dumpable": crate::process::is_dumpable(),
        "device_id": s.device_id.map(|(d, i)| json!([d, i])),
        "detached_header": s.detached_header,
        "reencryption": jobs.status(),
        "hot_zone_reads": st.hot_zone_reads.load(Relaxed),
        "hot_zone_waits": st.hot_zone_waits.load(Relaxed),
        "integrity": vol.integrity_protected(),
        "integrity_errors": st.integrity_errors.load(Relaxed),
    });
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
    v
}

/// The name `name` in the run directory, claimed for this process; an error if another
/// process holds it (a volume of that name is open, or being opened).
fn claim_name(dir: &Path, name: &str) -> CliResult<rundir::NameClaim> {
    rundir::claim_name(dir, name)?
        .ok_or_else(|| CliError::new(EXIT_BUSY, format!("a volume named {name} is already open")))
}

/// Makes a volume visible once its frontend is up: binds the control socket `ctl_path`,
/// writes NAME.pid, and on SIGTERM/SIGINT calls `stop` (again at the next signal while it
/// says the volume is busy; `force` at the next once it said yes). Returns the control
/// listener.
fn announce(
    ctl_path: &Path,
    pid_path: &Path,
    name: &str,
    stop: impl Fn() -> Result<(), String> + Send + 'static,
    force: impl Fn() -> bool + Send + 'static,
) -> CliResult<UnixListener> {
    rundir::clear_stale_socket(ctl_path)?;
    let ctl = rundir::bind_socket(ctl_path, SocketAccess::default())?;
    rundir::write_private_file(pid_path, format!("{}\n", std::process::id()).as_bytes())?;
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .map_err(|e| CliError::usage(format!("signals: {e}")))?;
    let name = name.to_string();
    std::thread::spawn(move || {
        let mut signalled = false;
        for _ in signals.forever() {
            // A second signal after one that was accepted: exit now (a single signal
            // during a `close` only closes).
            if signalled && force() {
                continue;
            }
            // Messages through say_briefly: a stderr nobody reads must not keep this
            // thread from the next signal.
            match stop() {
                Ok(()) => {
                    signalled = true;
                    shutdown::say_briefly(format!(
                        "{name}: closing (a second signal exits at once, without)"
                    ));
                }
                Err(e) => shutdown::say_briefly(format!("{name}: cannot close yet: {e}")),
            }
        }
    });
    Ok(ctl)
}

/// `resize BYTES|max` on the control socket: the volume's new size (`resized BYTES`), or
/// why not (`error CODE: why`).
fn resize(
    vol: &cryptblk_volume::Volume,
    c: &dyn Control,
    jobs: &online::OnlineJobs,
    suspension: &suspend::SuspendControl,
    new: Option<u64>,
) -> Reply {
    let refused = |why: String| Reply::Error {
        code: EXIT_BUSY,
        message: why,
    };
    if suspension.is_suspended() {
        return refused("the volume is suspended: luksResume it first".into());
    }
    if jobs.running() {
        return refused("a reencryption is running: resize after it".into());
    }
    if let Err(why) = c.can_resize() {
        return refused(why);
    }
    match vol.resize(new) {
        Ok(n) => Reply::Resized(n),
        Err(e) => Reply::Error {
            code: EXIT_USAGE,
            message: e.to_string(),
        },
    }
}

/// How the control loop takes a `close`: `close` stops the volume (or says why not),
/// `stopping` tells whether a stop was accepted (or the frontend ended), `closer` keeps the accepted `close`'s
/// connection for its last line, `limit` is the time the server may take.
struct ControlEnds<'a, F> {
    close: F,
    stopping: &'a Mutex<bool>,
    closer: &'a shutdown::Closer,
    limit: Duration,
}

/// Answers `status`, `close`, `reencrypt PASSPHRASE-HEX JSON` and `reencrypt-stop` on
/// the control socket until a `close` succeeds: `closing SECONDS` (the time the server may
/// take to exit), then `closed` or `error CODE: why` on the same connection as it exits
/// (`close` may refuse, e.g. while a FUSE file is in use: the client gets `busy: WHY`).
fn control_loop(
    ctl: UnixListener,
    status: impl Fn() -> Value,
    resize: impl Fn(Option<u64>) -> Reply,
    jobs: &Arc<online::OnlineJobs>,
    suspension: &suspend::SuspendControl,
    ends: ControlEnds<'_, impl Fn() -> Result<(), String>>,
) {
    // The longest line: a key file's worth of passphrase in hex, and the options.
    const LINE_MAX: u64 = 2 * crate::passphrase::KEYFILE_MAX as u64 + 4096;
    for conn in ctl.incoming() {
        let Ok(mut conn) = conn else { continue };
        let mut line = zeroize::Zeroizing::new(String::new());
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        if BufReader::new(&mut conn)
            .take(LINE_MAX)
            .read_line(&mut line)
            .is_err()
        {
            continue;
        }
        let busy = |why: &str| Reply::Error {
            code: EXIT_BUSY,
            message: why.to_string(),
        };
        let reply = match Request::parse(line.trim()) {
            Err(e) => e,
            Ok(Request::Reencrypt { passphrase, job }) => {
                if suspension.is_suspended() {
                    busy("the volume is suspended: luksResume it first")
                } else {
                    jobs.start(&passphrase, &job)
                }
            }
            Ok(Request::Resize(new)) => resize(new),
            Ok(Request::Resume {
                passphrase,
                key_slot,
            }) => suspension.resume(&passphrase, key_slot),
            Ok(Request::Suspend) => {
                // Not under the lock: a suspend waiting on storage that hangs must not hold
                // up a stop (which is armed first and bounded either way).
                let stopping = *ends.stopping.lock().unwrap_or_else(|e| e.into_inner());
                if stopping {
                    busy("the volume is closing")
                } else {
                    suspension.suspend(jobs.running())
                }
            }
            Ok(Request::ReencryptStop) => {
                jobs.request_stop();
                Reply::Stopping
            }
            Ok(Request::Status) => Reply::Status(status()),
            Ok(Request::Close) => {
                // Announced before the stop: the stop can end the whole close (and the
                // main thread exit) before this connection is kept.
                ends.closer.expect();
                match (ends.close)() {
                    Ok(()) => {
                        let closing = Reply::Closing(Some(ends.limit.as_secs()));
                        if writeln!(conn, "{closing}").is_ok() {
                            ends.closer.keep(conn);
                        } else {
                            ends.closer.give_up();
                        }
                        return;
                    }
                    Err(e) => {
                        ends.closer.give_up();
                        Reply::Busy(e)
                    }
                }
            }
        };
        let _ = writeln!(conn, "{reply}");
    }
}

/// On a block device, the data area must start and end on its logical blocks (a disk
/// with 4096-byte sectors cannot be read 512 bytes at a time): refused as device-mapper
/// refuses such a mapping, with cryptsetup's words.
fn check_block_alignment(device: &Path, vol: &Volume) -> CliResult<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(f) = std::fs::File::open(device) else {
        return Ok(());
    };
    if !f.metadata().is_ok_and(|m| m.file_type().is_block_device()) {
        return Ok(());
    }
    let Ok(block) = rustix::fs::ioctl_blksszget(&f).map(u64::from) else {
        return Ok(());
    };
    let size = cryptblk_device::BlockDevice::size(vol);
    if block > 512 && (!vol.data_offset().is_multiple_of(block) || !size.is_multiple_of(block)) {
        return Err(CliError::usage(format!(
            "Device size is not aligned to device logical block size ({} has {block}-byte \
             blocks; the volume starts at byte {} and holds {size} bytes).",
            device.display(),
            vol.data_offset()
        )));
    }
    Ok(())
}

/// Re-runs this command detached; the child signals readiness on its stdout.
fn spawn_daemon(ctx: &Ctx, a: &OpenArgs, dir: &Path) -> CliResult<()> {
    // A passphrase typed at a terminal that opens nothing is asked for again (-T), as
    // cryptsetup asks: the child says so by its exit code.
    let typed = a.vol.key.key_file().is_none()
        && a.vol.volume_key_file.is_none()
        && (a.vol.key.ask_password || std::io::IsTerminal::is_terminal(&std::io::stdin()));
    let tries = ctx.tries_for(typed);
    let mut attempt = 1;
    loop {
        match spawn_daemon_once(ctx, a, dir) {
            Err(e) if e.code == crate::error::EXIT_PERMISSION && attempt < tries => {
                eprintln!("{}", e.message);
                attempt += 1;
            }
            r => return r,
        }
    }
}

fn spawn_daemon_once(ctx: &Ctx, a: &OpenArgs, dir: &Path) -> CliResult<()> {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let log_path = dir.join(format!("{}.log", a.name));
    let log = rundir::create_private_file(&log_path)?;
    // The passphrase is read here (terminal or stdin) and handed over a pipe, never argv.
    let needs_pass = a.vol.key.key_file().is_none()
        && a.vol.volume_key_file.is_none()
        && a.vol.kind != cryptblk_volume::VolumeType::Integrity
        && !a.device.to_string_lossy().starts_with("mem:");
    let pass = if needs_pass {
        Some(crate::passphrase::get_passphrase(
            &a.vol.key.source(),
            &format!("Enter passphrase for {}: ", a.device.display()),
            false,
        )?)
    } else if a.vol.key.key_file().map(|p| p.as_path()) == Some(Path::new("-")) {
        // The key file is our stdin: skip --keyfile-offset here and hand the rest over
        // (the child, told by --daemon-child, reads it from offset 0). One byte more than
        // the child accepts, so that it still sees a key file that is too large.
        let size = crate::unlock::stdin_key_size(&a.vol)?;
        if size > crate::passphrase::KEYFILE_MAX {
            return Err(CliError::usage(format!(
                "--keyfile-size is larger than the maximum of {} bytes",
                crate::passphrase::KEYFILE_MAX
            )));
        }
        Some(crate::passphrase::read_stdin_key(
            a.vol.key.keyfile_offset,
            size + 1,
        )?)
    } else {
        None
    };
    let exe = std::env::current_exe().map_err(|e| CliError::usage(e.to_string()))?;
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    // The passphrase goes over the pipe: the child asks no agent again.
    args.retain(|x| x != "--daemon" && x != "--ask-password");
    args.push("--daemon-child".into());
    if let Some(spec) = &a.nbd
        && !args
            .iter()
            .any(|x| x == "--nbd" || x.to_string_lossy().starts_with("--nbd="))
    {
        // The drop-in's default frontend (see `open`).
        args.push("--nbd".into());
        args.push(spec.into());
    }
    let mut child = Command::new(exe);
    if ctx.program == "integritysetup" {
        // The child reads integritysetup's spelling of these arguments too.
        child.arg0(ctx.program);
    }
    let mut child = child
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| CliError::usage(format!("cannot start daemon: {e}")))?;
    {
        let mut stdin = child.stdin.take().expect("piped");
        match &pass {
            Some(p) if needs_pass => {
                let _ = stdin.write_all(p).and_then(|_| stdin.write_all(b"\n"));
            }
            Some(raw) => {
                let _ = stdin.write_all(raw);
            }
            None => {}
        }
    }
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line);
    // "READY" or "READY /dev/ublkbN": print the device node if there is one.
    if let Some(rest) = line.trim().strip_prefix("READY") {
        let rest = rest.trim();
        if ctx.dropin {
            // cryptsetup prints nothing; a script looking for /dev/mapper/NAME is told
            // why it is not there and where the volume is.
            let at = match (&a.nbd, rest.is_empty()) {
                (_, false) => rest.to_string(),
                (Some(spec), true) => format!("NBD {spec}"),
                (None, true) => "FUSE".to_string(),
            };
            eprintln!(
                "{}: served by cryptblk at {at} (no /dev/mapper/{} is made: no device-mapper); `{} close {}` stops it",
                a.name, a.name, ctx.program, a.name
            );
        } else {
            outln!("{}", if rest.is_empty() { &a.name } else { rest });
        }
        // -v: which keyslot (or token) opened it, as cryptsetup says.
        if ctx.verbose
            && let Ok(Reply::Status(v)) = crate::control::ask(dir, &a.name, &Request::Status)
        {
            if let Some(id) = v["token"]["id"].as_u64() {
                eprintln!("Token {id} unlocked the volume.");
            }
            if let Some(slot) = v["keyslot"].as_u64() {
                eprintln!("Key slot {slot} unlocked.");
            }
        }
        return Ok(());
    }
    let status = child.wait().map_err(|e| CliError::usage(e.to_string()))?;
    let log = rundir::read_private_file(&log_path).unwrap_or_default();
    Err(CliError::new(
        status.code().unwrap_or(1).max(1),
        log.trim_end().to_string(),
    ))
}
