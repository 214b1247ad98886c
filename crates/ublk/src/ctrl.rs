//! Control commands on /dev/ublk-control (io_uring `URING_CMD` with 128-byte SQEs).

use crate::sys::{self, CtrlCmd, DevInfo, Params};
use io_uring::{IoUring, cqueue, opcode, squeue, types};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;

/// Path of the ublk control device, through which devices are added, started, stopped,
/// recovered and deleted; it exists once the `ublk_drv` module is loaded.
pub const CONTROL_PATH: &str = "/dev/ublk-control";

/// An open control device. Each command uses a short-lived ring of its own, so commands
/// that block in the kernel (START_DEV waits for the queues) can run on any thread.
pub(crate) struct Control {
    file: File,
}

impl Control {
    pub(crate) fn open() -> io::Result<Self> {
        match OpenOptions::new().read(true).write(true).open(CONTROL_PATH) {
            Ok(file) => Ok(Control { file }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("ublk not available: {CONTROL_PATH} missing (modprobe ublk_drv)"),
            )),
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("ublk not available: cannot open {CONTROL_PATH}: {e}"),
            )),
        }
    }

    /// Runs one command; `Ok` holds the kernel's non-negative result.
    fn cmd(&self, op: u32, cmd: CtrlCmd) -> io::Result<i32> {
        let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder().build(2)?;
        let sqe = opcode::UringCmd80::new(types::Fd(self.file.as_raw_fd()), op)
            .cmd(sys::to_cmd_bytes(&cmd))
            .build()
            .user_data(1);
        // SAFETY: the buffer `cmd.addr` points to (if any) is owned by our caller and
        // outlives this function, which waits for the command to complete.
        unsafe { ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("control ring full"))?;
        loop {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Never taken by the kernel: nothing is in flight, the ring can go.
                Err(e) if !ring.submission().is_empty() => return Err(e),
                // Taken: the kernel may still write into the caller's buffer, so this
                // never returns before the command's completion.
                Err(_) => std::thread::yield_now(),
            }
            if let Some(cqe) = ring.completion().next() {
                let r = cqe.result();
                return if r < 0 {
                    Err(io::Error::from_raw_os_error(-r))
                } else {
                    Ok(r)
                };
            }
        }
    }

    /// The feature bits this kernel's ublk driver supports (GET_FEATURES, Linux 6.5+).
    pub(crate) fn features(&self) -> io::Result<u64> {
        let mut f: u64 = 0;
        let cmd = CtrlCmd {
            dev_id: u32::MAX,
            queue_id: u16::MAX,
            addr: &mut f as *mut u64 as u64,
            len: 8,
            ..Default::default()
        };
        self.cmd(sys::U_CMD_GET_FEATURES, cmd).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("ublk: GET_FEATURES failed ({e}); the kernel is too old (6.5+ needed)"),
            )
        })?;
        Ok(f)
    }

    pub(crate) fn add_dev(&self, info: &mut DevInfo) -> io::Result<()> {
        let cmd = CtrlCmd {
            dev_id: info.dev_id,
            queue_id: u16::MAX,
            addr: info as *mut DevInfo as u64,
            len: std::mem::size_of::<DevInfo>() as u16,
            ..Default::default()
        };
        self.cmd(sys::U_CMD_ADD_DEV, cmd).map(drop)
    }

    fn dev_cmd(&self, op: u32, dev_id: u32, data: u64) -> io::Result<i32> {
        let cmd = CtrlCmd {
            dev_id,
            queue_id: u16::MAX,
            data: [data],
            ..Default::default()
        };
        self.cmd(op, cmd)
    }

    pub(crate) fn dev_info(&self, dev_id: u32) -> io::Result<DevInfo> {
        let mut info = DevInfo::default();
        let cmd = CtrlCmd {
            dev_id,
            queue_id: u16::MAX,
            addr: &mut info as *mut DevInfo as u64,
            len: std::mem::size_of::<DevInfo>() as u16,
            ..Default::default()
        };
        self.cmd(sys::U_CMD_GET_DEV_INFO, cmd)?;
        Ok(info)
    }

    pub(crate) fn set_params(&self, dev_id: u32, p: &Params) -> io::Result<()> {
        let mut p = *p;
        p.len = params_len();
        let cmd = CtrlCmd {
            dev_id,
            queue_id: u16::MAX,
            addr: &mut p as *mut Params as u64,
            len: p.len as u16,
            ..Default::default()
        };
        self.cmd(sys::U_CMD_SET_PARAMS, cmd).map(drop)
    }

    pub(crate) fn params(&self, dev_id: u32) -> io::Result<Params> {
        let mut p = Params {
            len: params_len(),
            ..Default::default()
        };
        let cmd = CtrlCmd {
            dev_id,
            queue_id: u16::MAX,
            addr: &mut p as *mut Params as u64,
            len: p.len as u16,
            ..Default::default()
        };
        self.cmd(sys::U_CMD_GET_PARAMS, cmd)?;
        Ok(p)
    }

    /// CPUs the block layer maps to queue `q` (a `cpu_set_t` worth of bits).
    pub(crate) fn queue_affinity(&self, dev_id: u32, q: u16) -> io::Result<Vec<usize>> {
        let mut set = [0u64; 16]; // 1024 CPUs, the size of cpu_set_t
        let cmd = CtrlCmd {
            dev_id,
            queue_id: q,
            // The kernel takes the queue from data[0] for this command.
            data: [q as u64],
            addr: set.as_mut_ptr() as u64,
            len: std::mem::size_of_val(&set) as u16,
            ..Default::default()
        };
        self.cmd(sys::U_CMD_GET_QUEUE_AFFINITY, cmd)?;
        Ok((0..1024)
            .filter(|&c| set[c / 64] & (1 << (c % 64)) != 0)
            .collect())
    }

    pub(crate) fn start_dev(&self, dev_id: u32) -> io::Result<()> {
        self.dev_cmd(sys::U_CMD_START_DEV, dev_id, std::process::id() as u64)
            .map(drop)
    }
    pub(crate) fn stop_dev(&self, dev_id: u32) -> io::Result<()> {
        self.dev_cmd(sys::U_CMD_STOP_DEV, dev_id, 0).map(drop)
    }
    pub(crate) fn del_dev(&self, dev_id: u32) -> io::Result<()> {
        self.dev_cmd(sys::U_CMD_DEL_DEV, dev_id, 0).map(drop)
    }
    pub(crate) fn start_recovery(&self, dev_id: u32) -> io::Result<()> {
        self.dev_cmd(sys::U_CMD_START_USER_RECOVERY, dev_id, 0)
            .map(drop)
    }
    pub(crate) fn end_recovery(&self, dev_id: u32) -> io::Result<()> {
        self.dev_cmd(
            sys::U_CMD_END_USER_RECOVERY,
            dev_id,
            std::process::id() as u64,
        )
        .map(drop)
    }
}

/// The part of `struct ublk_params` we send and read back (basic, discard, devt).
fn params_len() -> u32 {
    (std::mem::offset_of!(Params, devt) + std::mem::size_of::<sys::ParamDevt>()) as u32
}
