//! The ublk kernel interface (include/uapi/linux/ublk_cmd.h), the parts cryptblk uses.

/// `_IOC(dir, 'u', nr, size)` as the kernel encodes it.
const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | ((b'u' as u32) << 8) | nr
}
const IOR: u32 = 2;
const IOWR: u32 = 3;
const CTRL: usize = std::mem::size_of::<CtrlCmd>();
const IO: usize = std::mem::size_of::<IoCmd>();

pub(crate) const U_CMD_GET_QUEUE_AFFINITY: u32 = ioc(IOR, 0x01, CTRL);
pub(crate) const U_CMD_GET_DEV_INFO: u32 = ioc(IOR, 0x02, CTRL);
pub(crate) const U_CMD_ADD_DEV: u32 = ioc(IOWR, 0x04, CTRL);
pub(crate) const U_CMD_DEL_DEV: u32 = ioc(IOWR, 0x05, CTRL);
pub(crate) const U_CMD_START_DEV: u32 = ioc(IOWR, 0x06, CTRL);
pub(crate) const U_CMD_STOP_DEV: u32 = ioc(IOWR, 0x07, CTRL);
pub(crate) const U_CMD_SET_PARAMS: u32 = ioc(IOWR, 0x08, CTRL);
pub(crate) const U_CMD_GET_PARAMS: u32 = ioc(IOR, 0x09, CTRL);
pub(crate) const U_CMD_START_USER_RECOVERY: u32 = ioc(IOWR, 0x10, CTRL);
pub(crate) const U_CMD_END_USER_RECOVERY: u32 = ioc(IOWR, 0x11, CTRL);
pub(crate) const U_CMD_GET_FEATURES: u32 = ioc(IOR, 0x13, CTRL);

pub(crate) const U_IO_FETCH_REQ: u32 = ioc(IOWR, 0x20, IO);
pub(crate) const U_IO_COMMIT_AND_FETCH_REQ: u32 = ioc(IOWR, 0x21, IO);

pub(crate) const IO_RES_OK: i32 = 0;

pub(crate) const CMD_BUF_OFFSET: i64 = 0;
pub(crate) const MAX_QUEUE_DEPTH: u32 = 4096;
/// Largest per-request buffer the kernel accepts (`UBLK_IO_BUF_BITS`).
pub(crate) const MAX_IO_BUF_BYTES: u32 = 1 << 25;

pub(crate) const F_URING_CMD_COMP_IN_TASK: u64 = 1 << 1;
pub(crate) const F_NEED_GET_DATA: u64 = 1 << 2;
pub(crate) const F_USER_RECOVERY: u64 = 1 << 3;
pub(crate) const F_USER_RECOVERY_REISSUE: u64 = 1 << 4;
pub(crate) const F_UNPRIVILEGED_DEV: u64 = 1 << 5;
pub(crate) const F_CMD_IOCTL_ENCODE: u64 = 1 << 6;
pub(crate) const F_USER_COPY: u64 = 1 << 7;
pub(crate) const F_ZONED: u64 = 1 << 8;
pub(crate) const F_USER_RECOVERY_FAIL_IO: u64 = 1 << 9;
pub(crate) const F_UPDATE_SIZE: u64 = 1 << 10;
pub(crate) const F_AUTO_BUF_REG: u64 = 1 << 11;
pub(crate) const F_QUIESCE: u64 = 1 << 12;
pub(crate) const F_PER_IO_DAEMON: u64 = 1 << 13;

/// Names of the feature bits, for messages and `status`.
pub(crate) const FEATURE_NAMES: &[(u64, &str)] = &[
    (1 << 0, "SUPPORT_ZERO_COPY"),
    (F_URING_CMD_COMP_IN_TASK, "URING_CMD_COMP_IN_TASK"),
    (F_NEED_GET_DATA, "NEED_GET_DATA"),
    (F_USER_RECOVERY, "USER_RECOVERY"),
    (F_USER_RECOVERY_REISSUE, "USER_RECOVERY_REISSUE"),
    (F_UNPRIVILEGED_DEV, "UNPRIVILEGED_DEV"),
    (F_CMD_IOCTL_ENCODE, "CMD_IOCTL_ENCODE"),
    (F_USER_COPY, "USER_COPY"),
    (F_ZONED, "ZONED"),
    (F_USER_RECOVERY_FAIL_IO, "USER_RECOVERY_FAIL_IO"),
    (F_UPDATE_SIZE, "UPDATE_SIZE"),
    (F_AUTO_BUF_REG, "AUTO_BUF_REG"),
    (F_QUIESCE, "QUIESCE"),
    (F_PER_IO_DAEMON, "PER_IO_DAEMON"),
];

pub(crate) const S_DEV_DEAD: u16 = 0;
pub(crate) const S_DEV_LIVE: u16 = 1;
pub(crate) const S_DEV_QUIESCED: u16 = 2;

/// `UBLK_IO_OP_READ`: read `nr_sectors` from `start_sector` into the tag's buffer.
pub const IO_OP_READ: u8 = 0;
/// `UBLK_IO_OP_WRITE`: write the tag's buffer (filled by the kernel) at `start_sector`.
pub const IO_OP_WRITE: u8 = 1;
/// `UBLK_IO_OP_FLUSH`: make completed writes durable; carries no data or range.
pub const IO_OP_FLUSH: u8 = 2;
/// `UBLK_IO_OP_DISCARD`: the range's data is no longer needed (may be deallocated).
pub const IO_OP_DISCARD: u8 = 3;
/// `UBLK_IO_OP_WRITE_ZEROES`: make the range read back as zeros, without a data buffer.
pub const IO_OP_WRITE_ZEROES: u8 = 5;
/// `UBLK_IO_F_FUA` (in [`IoDesc::op_flags`]): forced unit access; the write must be durable
/// when it completes.
pub const IO_F_FUA: u32 = 1 << 13;
pub(crate) const IO_F_NOUNMAP: u32 = 1 << 15;

pub(crate) const ATTR_READ_ONLY: u32 = 1 << 0;
pub(crate) const ATTR_ROTATIONAL: u32 = 1 << 1;
pub(crate) const ATTR_VOLATILE_CACHE: u32 = 1 << 2;
pub(crate) const ATTR_FUA: u32 = 1 << 3;

pub(crate) const PARAM_TYPE_BASIC: u32 = 1 << 0;
pub(crate) const PARAM_TYPE_DISCARD: u32 = 1 << 1;

/// `struct ublksrv_ctrl_cmd`: the payload of a control command (in the SQE's cmd area).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CtrlCmd {
    pub dev_id: u32,
    pub queue_id: u16,
    pub len: u16,
    pub addr: u64,
    pub data: [u64; 1],
    pub dev_path_len: u16,
    pub pad: u16,
    pub reserved: u32,
}

/// `struct ublksrv_ctrl_dev_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DevInfo {
    pub nr_hw_queues: u16,
    pub queue_depth: u16,
    pub state: u16,
    pub pad0: u16,
    pub max_io_buf_bytes: u32,
    pub dev_id: u32,
    pub ublksrv_pid: i32,
    pub pad1: u32,
    pub flags: u64,
    pub ublksrv_flags: u64,
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub reserved1: u64,
    pub reserved2: u64,
}

/// `struct ublksrv_io_desc`: one request, as the kernel describes it in the shared area.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoDesc {
    /// Operation in the low 8 bits, `UBLK_IO_F_*` flags above.
    pub op_flags: u32,
    /// Length in 512-byte sectors.
    pub nr_sectors: u32,
    /// Start in 512-byte sectors.
    pub start_sector: u64,
    /// Address of the request's data buffer in the server's memory: the one the server
    /// gave for this tag with `UBLK_IO_FETCH_REQ` / `UBLK_IO_COMMIT_AND_FETCH_REQ`.
    /// [`handle_request`](crate::handle_request) ignores it and uses the buffer it is given.
    pub addr: u64,
}

impl IoDesc {
    /// The operation (`UBLK_IO_OP_*`, e.g. [`IO_OP_READ`]): bits 0-7 of `op_flags`.
    pub fn op(&self) -> u8 {
        (self.op_flags & 0xff) as u8
    }
    /// The `UBLK_IO_F_*` flags (e.g. [`IO_F_FUA`]): `op_flags` with the operation masked
    /// out, bits kept in place.
    pub fn flags(&self) -> u32 {
        self.op_flags & !0xff
    }
}

/// `struct ublksrv_io_cmd`: the payload of FETCH / COMMIT_AND_FETCH.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IoCmd {
    pub q_id: u16,
    pub tag: u16,
    pub result: i32,
    pub addr: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ParamBasic {
    pub attrs: u32,
    pub logical_bs_shift: u8,
    pub physical_bs_shift: u8,
    pub io_opt_shift: u8,
    pub io_min_shift: u8,
    pub max_sectors: u32,
    pub chunk_sectors: u32,
    pub dev_sectors: u64,
    pub virt_boundary_mask: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ParamDiscard {
    pub discard_alignment: u32,
    pub discard_granularity: u32,
    pub max_discard_sectors: u32,
    pub max_write_zeroes_sectors: u32,
    pub max_discard_segments: u16,
    pub reserved0: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ParamDevt {
    pub char_major: u32,
    pub char_minor: u32,
    pub disk_major: u32,
    pub disk_minor: u32,
}

/// `struct ublk_params` up to the devt part (the kernel takes `len` bytes of it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Params {
    pub len: u32,
    pub types: u32,
    pub basic: ParamBasic,
    pub discard: ParamDiscard,
    pub devt: ParamDevt,
}

/// Copies a plain `repr(C)` value into the command area of an SQE.
pub(crate) fn to_cmd_bytes<T: Copy, const N: usize>(v: &T) -> [u8; N] {
    assert!(std::mem::size_of::<T>() <= N);
    let mut out = [0u8; N];
    // SAFETY: `T` is one of the `repr(C)` integer-only structs above (no padding bytes are
    // read uninitialised: they all have explicit pad fields), and it fits in `out`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (v as *const T).cast::<u8>(),
            out.as_mut_ptr(),
            std::mem::size_of::<T>(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_sizes_and_opcodes_match_the_kernel() {
        assert_eq!(std::mem::size_of::<CtrlCmd>(), 32);
        assert_eq!(std::mem::size_of::<DevInfo>(), 64);
        assert_eq!(std::mem::size_of::<IoDesc>(), 24);
        assert_eq!(std::mem::size_of::<IoCmd>(), 16);
        assert_eq!(std::mem::size_of::<ParamBasic>(), 32);
        assert_eq!(std::mem::size_of::<ParamDiscard>(), 20);
        // Values from the kernel header, as compiled by C.
        assert_eq!(U_CMD_ADD_DEV, 0xc020_7504);
        assert_eq!(U_CMD_GET_FEATURES, 0x8020_7513);
        assert_eq!(U_IO_FETCH_REQ, 0xc010_7520);
        assert_eq!(U_IO_COMMIT_AND_FETCH_REQ, 0xc010_7521);
    }
}
