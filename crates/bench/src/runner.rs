//! Runs the benchmark: checks, targets × workloads × repetitions through fio, the index,
//! then the report.

use crate::fio::{IoPath, RunParams, Workload, command_line, fio_args, parse_fio_json};
use crate::model::{Index, Meta, RunRecord, Status, TargetRecord};
use crate::preset::Preset;
use crate::target::{CipherChoice, HostEnv, HostTarget, host_targets, which};
use crate::vm::VmTarget;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What `cryptblk bench` was asked to do.
#[derive(Clone, Debug)]
pub struct Config {
    /// The workload matrix, and the defaults of the three overrides below.
    pub preset: Preset,
    /// Seconds per fio run, instead of the preset's.
    pub runtime: Option<u32>,
    /// Bytes per device or image, instead of the preset's.
    pub size: Option<u64>,
    /// fio runs per figure, instead of the preset's.
    pub repeats: Option<u32>,
    /// cryptblk targets (one per entry); empty: aes-xts-plain64:512:4096.
    pub ciphers: Vec<CipherChoice>,
    /// Report directory.
    pub out: PathBuf,
    /// Images and sockets (default: a directory under /dev/shm).
    pub work: PathBuf,
    /// The cryptblk binary the cryptblk targets run.
    pub cryptblk: PathBuf,
    /// How the report names that cryptblk (version and path).
    pub cryptblk_version: String,
    /// Only targets whose id starts with one of these.
    pub targets: Vec<String>,
    /// Only workloads whose id starts with one of these (or whose family is named).
    pub workloads: Vec<String>,
    /// Run the host (NBD) targets.
    pub host: bool,
    /// Run the VM targets.
    pub vm: bool,
    /// The VM harness (tests/vm/vm.sh).
    pub vm_harness: PathBuf,
}

impl Config {
    /// Run length and size, the overrides applied (at least 1 s).
    pub(crate) fn params(&self) -> RunParams {
        RunParams {
            runtime: self.runtime.unwrap_or(self.preset.runtime()).max(1),
            size: self.size.unwrap_or(self.preset.size()),
        }
    }

    /// fio runs per figure, the override applied (at least 1).
    pub(crate) fn repeats(&self) -> u32 {
        self.repeats.unwrap_or(self.preset.repeats()).max(1)
    }

    /// fio runs per target: every repetition of every workload.
    pub(crate) fn runs_per_target(&self, workloads: &[Workload]) -> usize {
        workloads.len() * self.repeats() as usize
    }

    /// The preset's workloads that `workloads` selects (all if it is empty).
    pub(crate) fn selected_workloads(&self) -> Vec<Workload> {
        self.preset
            .workloads()
            .into_iter()
            .filter(|w| {
                self.workloads.is_empty()
                    || self.workloads.iter().any(|f| {
                        w.id.starts_with(f.as_str())
                            || serde_json::to_value(w.family)
                                .ok()
                                .and_then(|v| v.as_str().map(|s| s == f))
                                == Some(true)
                    })
            })
            .collect()
    }

    /// Whether `targets` selects the target `id` (all are if it is empty).
    pub(crate) fn wants_target(&self, id: &str) -> bool {
        self.targets.is_empty() || self.targets.iter().any(|f| id.starts_with(f.as_str()))
    }
}

/// Progress bar with ETA on stderr (a line per step when stderr is not a terminal).
pub(crate) struct Progress {
    /// Steps (fio runs) expected.
    total: usize,
    /// Steps finished.
    done: usize,
    /// When the bar was created: the measured time per step counts from here.
    start: Instant,
    /// Expected time per step, until one has finished.
    guess: Duration,
    /// stderr is a terminal: redraw one line in place.
    tty: bool,
    /// Without a terminal, the next `show` prints its line.
    log_next: bool,
}

impl Progress {
    /// A bar for `total` steps, each guessed to take `guess_per_step`.
    pub(crate) fn new(total: usize, guess_per_step: Duration) -> Self {
        Progress {
            total,
            done: 0,
            start: Instant::now(),
            guess: guess_per_step,
            tty: std::io::stderr().is_terminal(),
            log_next: false,
        }
    }

    /// Remaining time: the measured mean per step once something ran, else the guess.
    pub(crate) fn eta(&self) -> Duration {
        let left = self.total.saturating_sub(self.done) as u32;
        if self.done == 0 {
            self.guess * left
        } else {
            self.start.elapsed() / self.done as u32 * left
        }
    }

    /// Redraws the bar with `what` as what runs now; without a terminal, prints a line
    /// only for [`Progress::step`] and [`Progress::note`].
    pub(crate) fn show(&self, what: &str) {
        let frac = if self.total == 0 {
            1.0
        } else {
            self.done as f64 / self.total as f64
        };
        let width = 30;
        let full = (frac * width as f64).round() as usize;
        let eta = self.eta().as_secs();
        let line = format!(
            "[{}{}] {}/{} {:>3}% ETA {}m{:02}s {}",
            "#".repeat(full),
            "-".repeat(width - full),
            self.done,
            self.total,
            (frac * 100.0).round(),
            eta / 60,
            eta % 60,
            what
        );
        let mut e = std::io::stderr();
        if self.tty {
            let line: String = line.chars().take(118).collect();
            let _ = write!(e, "\r{line:<118}");
        } else if self.log_next {
            let _ = writeln!(e, "{line}");
        }
        let _ = e.flush();
    }

    /// Counts one finished step; without a terminal, logs one line per step.
    pub(crate) fn step(&mut self, what: &str) {
        self.done += 1;
        self.log_next = true;
        self.show(what);
        self.log_next = false;
    }

    /// A message that is logged even without a terminal (starting a target, ...).
    pub(crate) fn note(&mut self, what: &str) {
        self.log_next = true;
        self.show(what);
        self.log_next = false;
    }

    /// Steps that will not run (a target skipped or failed to start).
    pub(crate) fn drop_steps(&mut self, n: usize) {
        self.total = self.total.saturating_sub(n);
    }

    /// Ends the bar's line on a terminal.
    pub(crate) fn finish(&self) {
        if self.tty {
            let _ = writeln!(std::io::stderr());
        }
    }
}

/// The first line `cmd arg` prints (its version), if it runs.
fn tool_version(cmd: &str, arg: &str) -> Option<String> {
    let out = Command::new(cmd).arg(arg).output().ok()?;
    let s =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    s.lines()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
}

/// The CPU's model name from /proc/cpuinfo.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The CPU flags that matter for crypto speed (AES-NI, AVX, VAES, ...).
fn cpu_flags() -> String {
    let want = [
        "aes",
        "avx2",
        "avx512f",
        "vaes",
        "vpclmulqdq",
        "pclmulqdq",
        "sha_ni",
    ];
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("flags")).map(|l| {
                l.split_whitespace()
                    .filter(|f| want.contains(f))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        })
        .unwrap_or_default()
}

/// This machine's facts for the report: CPU, cores, kernel, tool versions, work directory.
pub(crate) fn host_env(cfg: &Config) -> Vec<(String, String)> {
    let mut v = vec![
        ("CPU".to_string(), cpu_model()),
        (
            "cores".to_string(),
            std::thread::available_parallelism()
                .map(|n| n.get().to_string())
                .unwrap_or_default(),
        ),
        ("crypto CPU flags".to_string(), cpu_flags()),
        (
            "kernel".to_string(),
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
        ),
        ("cryptblk".to_string(), cfg.cryptblk_version.clone()),
    ];
    for (name, cmd, arg) in [
        ("fio", "fio", "--version"),
        ("nbdkit", "nbdkit", "--version"),
        ("qemu-nbd", "qemu-nbd", "--version"),
    ] {
        v.push((
            name.to_string(),
            tool_version(cmd, arg).unwrap_or_else(|| "not installed".into()),
        ));
    }
    v.push(("work directory".to_string(), cfg.work.display().to_string()));
    v
}

/// Free bytes for unprivileged users on the file system holding `dir`.
pub(crate) fn free_space(dir: &Path) -> Result<u64, String> {
    let st = rustix::fs::statvfs(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Bytes the host targets need in the work directory (one image at a time).
pub(crate) fn space_needed(size: u64) -> u64 {
    size + (16 << 20) + (8 << 20)
}

/// Runs fio, killing it if it outlives its runtime by far (a hung server).
fn run_fio(args: &[String], runtime: u32, err_path: &Path) -> Result<(), String> {
    let errf =
        std::fs::File::create(err_path).map_err(|e| format!("{}: {e}", err_path.display()))?;
    let mut child = Command::new("fio")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(errf)
        .spawn()
        .map_err(|e| format!("cannot run fio: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(runtime as u64 * 3 + 60);
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("fio did not finish in time (killed)".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if !status.success() {
        let err = std::fs::read_to_string(err_path).unwrap_or_default();
        let tail: Vec<&str> = err.lines().rev().take(3).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!("fio exited with {status}: {}", tail.join(" / ")));
    }
    Ok(())
}

/// Runs every (workload, repetition) of one started target; `io` is where fio goes.
pub(crate) fn run_workloads(
    cfg: &Config,
    target: &str,
    io: &IoPath,
    workloads: &[Workload],
    index: &mut Index,
    progress: &mut Progress,
) -> Result<(), String> {
    let p = cfg.params();
    let raw = cfg.out.join("raw").join(target);
    std::fs::create_dir_all(&raw).map_err(|e| format!("{}: {e}", raw.display()))?;
    for w in workloads {
        for rep in 1..=cfg.repeats() {
            progress.show(&format!("{target} {} r{rep}", w.id));
            let file = format!("raw/{target}/{}.r{rep}.json", w.id);
            let out = cfg.out.join(&file);
            let args = fio_args(w, io, &p, &out);
            let err_path = out.with_extension("err");
            let mut error = run_fio(&args, p.runtime, &err_path).err();
            if error.is_none()
                && let Err(e) = std::fs::read_to_string(&out)
                    .map_err(|e| e.to_string())
                    .and_then(|t| parse_fio_json(&t))
            {
                error = Some(e);
            }
            if std::fs::metadata(&err_path).is_ok_and(|m| m.len() == 0) {
                let _ = std::fs::remove_file(&err_path);
            }
            index.runs.push(RunRecord {
                target: target.to_string(),
                workload: w.id.clone(),
                rep,
                file,
                command: command_line("fio", &args),
                error,
            });
            progress.step(&format!("{target} {} r{rep}", w.id));
        }
    }
    Ok(())
}

/// Runs the benchmark and writes the report; returns the path of report.md.
pub fn run(cfg: &Config) -> Result<PathBuf, String> {
    if which("fio").is_none() {
        return Err(
            "fio not found in PATH: cryptblk bench drives fio; install it with \
                    `apt-get install fio` (Debian/Ubuntu; fio >= 3.27 has the nbd engine)"
                .into(),
        );
    }
    let workloads = cfg.selected_workloads();
    if workloads.is_empty() {
        return Err("no workload matches --workloads".into());
    }
    let p = cfg.params();
    prepare_work_dir(cfg, p.size)?;
    std::fs::create_dir_all(cfg.out.join("logs"))
        .map_err(|e| format!("{}: {e}", cfg.out.display()))?;
    let mut index = new_index(cfg, &workloads);
    let (hosts, vm_targets) = selected_targets(cfg)?;
    let mut progress = Progress::new(
        (hosts.len() + vm_targets.len()) * cfg.runs_per_target(&workloads),
        Duration::from_millis(p.runtime as u64 * 1000 + 400),
    );
    run_host_targets(cfg, &hosts, &workloads, &mut index, &mut progress)?;
    if !vm_targets.is_empty() {
        crate::vm::run(cfg, &vm_targets, &workloads, &mut index, &mut progress)?;
    }
    progress.finish();
    let _ = std::fs::remove_dir(&cfg.work);
    index.save(&cfg.out)?;
    crate::report::generate(&cfg.out)?;
    Ok(cfg.out.join("report.md"))
}

/// Creates the work directory and, for the host targets, checks that an image fits.
fn prepare_work_dir(cfg: &Config, size: u64) -> Result<(), String> {
    std::fs::create_dir_all(&cfg.work).map_err(|e| format!("{}: {e}", cfg.work.display()))?;
    if !cfg.host {
        return Ok(());
    }
    let free = free_space(&cfg.work)?;
    let need = space_needed(size);
    if free < need {
        let _ = std::fs::remove_dir(&cfg.work);
        return Err(format!(
            "not enough space in the work directory {}: {} MiB free, {} MiB needed \
             for --size {} MiB (image plus LUKS header); use a smaller --size or another --dir",
            cfg.work.display(),
            free >> 20,
            need.div_ceil(1 << 20),
            size >> 20
        ));
    }
    Ok(())
}

/// The index before anything ran: the run's parameters and environment, the workloads.
fn new_index(cfg: &Config, workloads: &[Workload]) -> Index {
    let p = cfg.params();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Index {
        meta: Meta {
            preset: cfg.preset.name().into(),
            runtime: p.runtime,
            size: p.size,
            repeats: cfg.repeats(),
            started,
            env: host_env(cfg),
            notes: Vec::new(),
        },
        workloads: workloads.to_vec(),
        targets: Vec::new(),
        runs: Vec::new(),
    }
}

/// The host and VM targets asked for, for the `--cipher`s (default
/// aes-xts-plain64:512:4096).
fn selected_targets(cfg: &Config) -> Result<(Vec<HostTarget>, Vec<VmTarget>), String> {
    let ciphers = if cfg.ciphers.is_empty() {
        vec!["aes-xts-plain64:512:4096".parse()?]
    } else {
        cfg.ciphers.clone()
    };
    let hosts: Vec<_> = if cfg.host {
        host_targets(&ciphers)
            .into_iter()
            .filter(|t| cfg.wants_target(&t.id))
            .collect()
    } else {
        Vec::new()
    };
    let vm_targets: Vec<_> = if cfg.vm {
        crate::vm::vm_targets(&ciphers)
            .into_iter()
            .filter(|t| cfg.wants_target(&t.id))
            .collect()
    } else {
        Vec::new()
    };
    Ok((hosts, vm_targets))
}

/// Whether this fio has the nbd engine (the host targets need it).
fn fio_has_nbd_engine() -> bool {
    Command::new("fio")
        .arg("--enghelp=nbd")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs every host target in turn, recording each in `index` (saved after each target
/// that was started).
fn run_host_targets(
    cfg: &Config,
    hosts: &[HostTarget],
    workloads: &[Workload],
    index: &mut Index,
    progress: &mut Progress,
) -> Result<(), String> {
    let nbd_engine = fio_has_nbd_engine();
    let env = HostEnv {
        cryptblk: cfg.cryptblk.clone(),
        work: cfg.work.clone(),
        logs: cfg.out.join("logs"),
        size: cfg.params().size,
    };
    for t in hosts {
        let skip = if nbd_engine {
            t.missing_tool()
        } else {
            Some("this fio has no nbd engine (Debian's fio package has it)".into())
        };
        if let Some(reason) = skip {
            let mut rec = host_record(t);
            rec.status = Status::Skipped;
            rec.reason = Some(reason);
            progress.drop_steps(cfg.runs_per_target(workloads));
            index.targets.push(rec);
            continue;
        }
        let rec = measure_host_target(cfg, t, &env, workloads, index, progress)?;
        index.targets.push(rec);
        index.save(&cfg.out)?;
    }
    Ok(())
}

/// The record of a host target that ran (so far).
fn host_record(t: &HostTarget) -> TargetRecord {
    TargetRecord {
        id: t.id.clone(),
        label: t.label.clone(),
        env: "host".into(),
        encrypted: t.encrypted,
        baseline: t.baseline.clone(),
        status: Status::Ok,
        reason: None,
        setup: Vec::new(),
    }
}

/// Starts `t`, runs the workloads on it and stops it again; returns its record, failed
/// if it did not start.
fn measure_host_target(
    cfg: &Config,
    t: &HostTarget,
    env: &HostEnv,
    workloads: &[Workload],
    index: &mut Index,
    progress: &mut Progress,
) -> Result<TargetRecord, String> {
    let mut rec = host_record(t);
    progress.note(&format!("starting {}", t.id));
    match t.start(env, &mut rec.setup) {
        Ok(running) => {
            let io = IoPath::Nbd {
                uri: running.uri.clone(),
            };
            let r = run_workloads(cfg, &t.id, &io, workloads, index, progress);
            running.stop();
            r?;
        }
        Err(e) => {
            rec.status = Status::Failed;
            rec.reason = Some(e);
            progress.drop_steps(cfg.runs_per_target(workloads));
        }
    }
    Ok(rec)
}
