//! A vhost-user-blk driver that plays the VM's part, for tests and benchmarks: guest memory
//! in a memfd shared with the backend, split virtqueues laid out in it, eventfds for kicks
//! and calls, the protocol by rust-vmm's `vhost` frontend. It talks to any vhost-user-blk
//! backend (cryptblk's, qemu-storage-daemon's), and can also build chains no honest driver
//! would (descriptors outside memory, loops), to check that a backend survives them.
//!
//! Each queue has `depth` slots; slot `i` owns descriptors `3i`, `3i+1`, `3i+2` (header,
//! data, status) and a buffer of `max_io` bytes in guest memory.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{Ordering, fence};
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};
use vmm_sys_util::eventfd::EventFd;

/// virtio-blk request types, for [`Request::kind`].
pub mod kind {
    /// Read.
    pub const IN: u32 = 0;
    /// Write.
    pub const OUT: u32 = 1;
    /// Flush the write cache.
    pub const FLUSH: u32 = 4;
    /// The device's identity string.
    pub const GET_ID: u32 = 8;
    /// Discard.
    pub const DISCARD: u32 = 11;
    /// Write zeroes.
    pub const WRITE_ZEROES: u32 = 13;
}

/// Status byte values a device answers with.
pub mod status {
    /// Done.
    pub const OK: u8 = 0;
    /// Failed.
    pub const IOERR: u8 = 1;
    /// Not supported.
    pub const UNSUPP: u8 = 2;
}

const F_RING_EVENT_IDX: u64 = 1 << 29;
const F_PROTOCOL_FEATURES: u64 = 1 << 30;
const F_MQ: u64 = 1 << 12;
const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;

/// How the client sets itself up.
#[derive(Clone, Copy, Debug)]
pub struct ClientOptions {
    /// Virtqueues to use.
    pub queues: u16,
    /// Requests in flight per queue.
    pub depth: u16,
    /// Largest data buffer per request.
    pub max_io: usize,
    /// Negotiate `VIRTIO_RING_F_EVENT_IDX` if offered.
    pub event_idx: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            queues: 1,
            depth: 16,
            max_io: 1 << 20,
            event_idx: true,
        }
    }
}

/// One request for [`Client::submit`].
#[derive(Clone, Copy, Debug)]
pub struct Request {
    /// A [`kind`] value.
    pub kind: u32,
    /// The first 512-byte sector.
    pub sector: u64,
    /// Bytes of data (from the slot's buffer for writes; into it for reads).
    pub len: u32,
}

/// A completed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The slot it used.
    pub slot: u16,
    /// Its status byte.
    pub status: u8,
    /// The used length the device reported.
    pub len: u32,
}

/// One raw descriptor for [`Client::submit_raw`]: anything, valid or not.
#[derive(Clone, Copy, Debug)]
pub struct RawDesc {
    /// Guest address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// `VIRTQ_DESC_F_*` flags.
    pub flags: u16,
    /// Next descriptor index.
    pub next: u16,
}

struct Queue {
    size: u16,
    desc: u64,
    avail: u64,
    used: u64,
    kick: EventFd,
    call: EventFd,
    avail_idx: u16,
    used_seen: u16,
    /// Guest address of each slot's area: 16-byte header, status byte, then data.
    slots: Vec<u64>,
}

/// A connected vhost-user-blk driver.
pub struct Client {
    frontend: Frontend,
    mem: GuestMemoryMmap<()>,
    _memfd: File,
    queues: Vec<Queue>,
    event_idx: bool,
    max_io: usize,
    /// The device's feature bits that were acked.
    pub features: u64,
}

fn err(e: impl std::fmt::Debug) -> io::Error {
    io::Error::other(format!("{e:?}"))
}

/// An error of the protocol step `what`.
fn step<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> io::Error {
    move |e| io::Error::other(format!("vhost-user {what}: {e:?}"))
}

fn align(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

impl Client {
    /// Connects to the backend's socket, negotiates, shares memory and starts every queue.
    pub fn connect(path: &Path, opt: ClientOptions) -> io::Result<Client> {
        let mut frontend =
            Frontend::connect(path, u64::from(opt.queues)).map_err(step("connect"))?;
        frontend.set_owner().map_err(step("set_owner"))?;
        let offered = frontend.get_features().map_err(step("get_features"))?;
        let mut features = offered & !(F_RING_EVENT_IDX);
        if opt.event_idx {
            features |= offered & F_RING_EVENT_IDX;
        }
        if opt.queues > 1 && offered & F_MQ == 0 {
            return Err(io::Error::other("the device has one queue only"));
        }
        if offered & F_PROTOCOL_FEATURES != 0 {
            let pf = frontend
                .get_protocol_features()
                .map_err(step("get_protocol_features"))?;
            let want = pf
                & (VhostUserProtocolFeatures::MQ
                    | VhostUserProtocolFeatures::CONFIG
                    | VhostUserProtocolFeatures::REPLY_ACK);
            frontend
                .set_protocol_features(want)
                .map_err(step("set_protocol_features"))?;
        }
        frontend
            .set_features(features)
            .map_err(step("set_features"))?;

        let depth = opt.depth.max(1);
        let size = (u32::from(depth) * 3).next_power_of_two().min(32768) as u16;
        let ring_bytes =
            16 * u64::from(size) + 6 + 2 * u64::from(size) + 4096 + 6 + 8 * u64::from(size) + 4096;
        let slot_bytes = align(opt.max_io as u64 + 4096, 4096);
        let total = align(
            u64::from(opt.queues) * (ring_bytes + u64::from(depth) * slot_bytes) + (1 << 20),
            2 << 20,
        );
        let fd = rustix::fs::memfd_create("cryptblk-vhost-client", rustix::fs::MemfdFlags::CLOEXEC)
            .map_err(io::Error::from)?;
        let memfd = File::from(fd);
        memfd.set_len(total)?;
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files([(
            GuestAddress(0),
            total as usize,
            Some(FileOffset::new(memfd.try_clone()?, 0)),
        )])
        .map_err(err)?;
        let region = mem
            .iter()
            .next()
            .ok_or_else(|| io::Error::other("no region"))?;
        let info = VhostUserMemoryRegionInfo::from_guest_region(region).map_err(err)?;
        let host_base = info.userspace_addr;
        let _ = region.len();
        frontend
            .set_mem_table(&[info])
            .map_err(step("set_mem_table"))?;

        let mut queues = Vec::new();
        let mut at = 4096u64;
        for q in 0..usize::from(opt.queues) {
            let desc = align(at, 16);
            let avail = desc + 16 * u64::from(size);
            let used = align(avail + 6 + 2 * u64::from(size), 4096);
            at = align(used + 6 + 8 * u64::from(size), 4096);
            let mut slots = Vec::new();
            for _ in 0..depth {
                slots.push(at);
                at += slot_bytes;
            }
            let kick = EventFd::new(libc::EFD_NONBLOCK).map_err(err)?;
            let call = EventFd::new(0).map_err(err)?;
            frontend
                .set_vring_num(q, size)
                .map_err(step("set_vring_num"))?;
            frontend
                .set_vring_addr(
                    q,
                    &VringConfigData {
                        queue_max_size: size,
                        queue_size: size,
                        flags: 0,
                        desc_table_addr: host_base + desc,
                        used_ring_addr: host_base + used,
                        avail_ring_addr: host_base + avail,
                        log_addr: None,
                    },
                )
                .map_err(step("set_vring_addr"))?;
            frontend
                .set_vring_base(q, 0)
                .map_err(step("set_vring_base"))?;
            frontend
                .set_vring_call(q, &call)
                .map_err(step("set_vring_call"))?;
            frontend
                .set_vring_kick(q, &kick)
                .map_err(step("set_vring_kick"))?;
            if features & F_PROTOCOL_FEATURES != 0 {
                frontend
                    .set_vring_enable(q, true)
                    .map_err(step("set_vring_enable"))?;
            }
            queues.push(Queue {
                size,
                desc,
                avail,
                used,
                kick,
                call,
                avail_idx: 0,
                used_seen: 0,
                slots,
            });
        }
        Ok(Client {
            frontend,
            mem,
            _memfd: memfd,
            queues,
            event_idx: features & F_RING_EVENT_IDX != 0,
            max_io: opt.max_io,
            features,
        })
    }

    /// `size` bytes of the device's configuration space from `offset`.
    pub fn config(&mut self, offset: u32, size: u32) -> io::Result<Vec<u8>> {
        let buf = vec![0u8; size as usize];
        let (_, payload) = self
            .frontend
            .get_config(offset, size, VhostUserConfigFlags::WRITABLE, &buf)
            .map_err(step("get_config"))?;
        Ok(payload.to_vec())
    }

    /// The capacity the device reports, in bytes.
    pub fn capacity(&mut self) -> io::Result<u64> {
        let c = self.config(0, 8)?;
        Ok(u64::from_le_bytes(c[..8].try_into().expect("8 bytes")) * 512)
    }

    /// The data buffer of `slot` in `queue` (guest address).
    pub fn slot_data(&self, queue: usize, slot: u16) -> u64 {
        self.queues[queue].slots[usize::from(slot)] + 4096
    }

    /// Copies `data` into guest memory at `addr`.
    pub fn write_mem(&self, addr: u64, data: &[u8]) -> io::Result<()> {
        self.mem.write_slice(data, GuestAddress(addr)).map_err(err)
    }

    /// Copies guest memory at `addr` into `buf`.
    pub fn read_mem(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        self.mem.read_slice(buf, GuestAddress(addr)).map_err(err)
    }

    /// Size of guest memory.
    pub fn mem_size(&self) -> u64 {
        self.mem.iter().map(|r| r.len()).sum()
    }

    fn put_desc(&self, q: usize, index: u16, d: RawDesc) -> io::Result<()> {
        let at = GuestAddress(self.queues[q].desc + 16 * u64::from(index));
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&d.addr.to_le_bytes());
        b[8..12].copy_from_slice(&d.len.to_le_bytes());
        b[12..14].copy_from_slice(&d.flags.to_le_bytes());
        b[14..16].copy_from_slice(&d.next.to_le_bytes());
        self.mem.write_slice(&b, at).map_err(err)
    }

    /// Puts `head` on the available ring and kicks the device if it asked to be.
    fn publish(&mut self, q: usize, heads: &[u16]) -> io::Result<()> {
        let queue = &self.queues[q];
        let old = queue.avail_idx;
        let mut idx = old;
        for &h in heads {
            let slot = queue.avail + 4 + 2 * u64::from(idx % queue.size);
            self.mem
                .write_obj(h.to_le(), GuestAddress(slot))
                .map_err(err)?;
            idx = idx.wrapping_add(1);
        }
        fence(Ordering::SeqCst);
        self.mem
            .store(
                idx.to_le(),
                GuestAddress(queue.avail + 2),
                Ordering::Release,
            )
            .map_err(err)?;
        fence(Ordering::SeqCst);
        let kick = if self.event_idx {
            let ev: u16 = self
                .mem
                .load(
                    GuestAddress(queue.used + 4 + 8 * u64::from(queue.size)),
                    Ordering::Acquire,
                )
                .map_err(err)?;
            // vring_need_event
            idx.wrapping_sub(ev).wrapping_sub(1) < idx.wrapping_sub(old)
        } else {
            true
        };
        self.queues[q].avail_idx = idx;
        if kick {
            self.queues[q].kick.write(1).map_err(step("kick"))?;
        }
        Ok(())
    }

    /// Submits requests on `queue`, one per slot given (a slot must not be in flight); the
    /// data of writes must already be in the slot's buffer ([`Client::slot_data`]).
    pub fn submit(&mut self, q: usize, reqs: &[(u16, Request)]) -> io::Result<()> {
        let mut heads = Vec::with_capacity(reqs.len());
        for &(slot, r) in reqs {
            let area = self.queues[q].slots[usize::from(slot)];
            if r.len as usize > self.max_io {
                return Err(io::Error::other("request larger than the client's buffers"));
            }
            let mut hdr = [0u8; 16];
            hdr[0..4].copy_from_slice(&r.kind.to_le_bytes());
            hdr[8..16].copy_from_slice(&r.sector.to_le_bytes());
            self.write_mem(area, &hdr)?;
            self.write_mem(area + 16, &[0xff])?;
            let base = 3 * slot;
            let device_writes = matches!(r.kind, kind::IN | kind::GET_ID);
            if r.len > 0 {
                self.put_desc(
                    q,
                    base,
                    RawDesc {
                        addr: area,
                        len: 16,
                        flags: DESC_F_NEXT,
                        next: base + 1,
                    },
                )?;
                let flags = DESC_F_NEXT | if device_writes { DESC_F_WRITE } else { 0 };
                self.put_desc(
                    q,
                    base + 1,
                    RawDesc {
                        addr: area + 4096,
                        len: r.len,
                        flags,
                        next: base + 2,
                    },
                )?;
            } else {
                self.put_desc(
                    q,
                    base,
                    RawDesc {
                        addr: area,
                        len: 16,
                        flags: DESC_F_NEXT,
                        next: base + 2,
                    },
                )?;
            }
            self.put_desc(
                q,
                base + 2,
                RawDesc {
                    addr: area + 16,
                    len: 1,
                    flags: DESC_F_WRITE,
                    next: 0,
                },
            )?;
            heads.push(base);
        }
        self.publish(q, &heads)
    }

    /// Writes `descs` into the descriptor table from index `first` on and makes `head`
    /// available: for chains no honest driver builds. Completion comes back as a slot of
    /// `head / 3`.
    pub fn submit_raw(
        &mut self,
        q: usize,
        first: u16,
        descs: &[RawDesc],
        head: u16,
    ) -> io::Result<()> {
        for (i, d) in descs.iter().enumerate() {
            self.put_desc(q, first + i as u16, *d)?;
        }
        self.publish(q, &[head])
    }

    /// The guest address of `slot`'s header (the status byte follows at +16).
    pub fn slot_area(&self, q: usize, slot: u16) -> u64 {
        self.queues[q].slots[usize::from(slot)]
    }

    /// Waits until at least one request of `queue` completes; returns all that have.
    pub fn wait(&mut self, q: usize) -> io::Result<Vec<Completion>> {
        let mut done = self.wait_any(&[q])?;
        Ok(done.pop().map(|(_, c)| c).unwrap_or_default())
    }

    /// Waits until at least one request of any of `qs` completes; returns each queue's
    /// completions (a driver with one thread for several queues, as a guest vCPU may be).
    pub fn wait_any(&mut self, qs: &[usize]) -> io::Result<Vec<(usize, Vec<Completion>)>> {
        loop {
            let out = self.reap_all(qs)?;
            if !out.is_empty() {
                return Ok(out);
            }
            if self.event_idx {
                for &q in qs {
                    let queue = &self.queues[q];
                    let at = GuestAddress(queue.avail + 4 + 2 * u64::from(queue.size));
                    self.mem
                        .store(queue.used_seen.to_le(), at, Ordering::Release)
                        .map_err(err)?;
                }
                fence(Ordering::SeqCst);
                let out = self.reap_all(qs)?;
                if !out.is_empty() {
                    return Ok(out);
                }
            }
            self.wait_calls(qs)?;
        }
    }

    /// The completions of each of `qs` that has some, without waiting.
    fn reap_all(&mut self, qs: &[usize]) -> io::Result<Vec<(usize, Vec<Completion>)>> {
        let mut out = Vec::new();
        for &q in qs {
            let done = self.reap(q)?;
            if !done.is_empty() {
                out.push((q, done));
            }
        }
        Ok(out)
    }

    /// Sleeps until the device signals one of `qs`, and clears what it signalled.
    fn wait_calls(&self, qs: &[usize]) -> io::Result<()> {
        use std::os::fd::{AsRawFd, BorrowedFd};
        if let [q] = qs {
            return self.wait_call(*q);
        }
        let fds: Vec<BorrowedFd<'_>> = qs
            .iter()
            // SAFETY: each descriptor belongs to its queue's `call`, which outlives the borrow.
            .map(|&q| unsafe { BorrowedFd::borrow_raw(self.queues[q].call.as_raw_fd()) })
            .collect();
        let mut p: Vec<_> = fds
            .iter()
            .map(|fd| rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN))
            .collect();
        match rustix::event::poll(&mut p, None) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        for (i, &q) in qs.iter().enumerate() {
            if !p[i].revents().is_empty() {
                self.wait_call(q)?;
            }
        }
        Ok(())
    }

    /// Sleeps until the device signals `queue`. Backends may set the eventfd non-blocking
    /// (its flags are shared with them: qemu-storage-daemon does), so it is polled first.
    fn wait_call(&self, q: usize) -> io::Result<()> {
        use std::os::fd::{AsRawFd, BorrowedFd};
        let call = &self.queues[q].call;
        loop {
            match call.read() {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // SAFETY: the descriptor belongs to `call`, which outlives this borrow.
                    let fd = unsafe { BorrowedFd::borrow_raw(call.as_raw_fd()) };
                    let mut p = [rustix::event::PollFd::new(
                        &fd,
                        rustix::event::PollFlags::IN,
                    )];
                    match rustix::event::poll(&mut p, None) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(step::<io::Error>("call")(e)),
            }
        }
    }

    /// The requests of `queue` completed since the last look, without waiting.
    pub fn reap(&mut self, q: usize) -> io::Result<Vec<Completion>> {
        let queue = &self.queues[q];
        let idx: u16 = self
            .mem
            .load(GuestAddress(queue.used + 2), Ordering::Acquire)
            .map_err(err)?;
        fence(Ordering::SeqCst);
        let mut out = Vec::new();
        let mut seen = queue.used_seen;
        while seen != idx {
            let e = queue.used + 4 + 8 * u64::from(seen % queue.size);
            let id: u32 = self.mem.read_obj(GuestAddress(e)).map_err(err)?;
            let len: u32 = self.mem.read_obj(GuestAddress(e + 4)).map_err(err)?;
            let slot = (id / 3) as u16;
            let mut st = [0u8];
            if let Some(area) = queue.slots.get(usize::from(slot)) {
                self.mem
                    .read_slice(&mut st, GuestAddress(area + 16))
                    .map_err(err)?;
            }
            out.push(Completion {
                slot,
                status: st[0],
                len,
            });
            seen = seen.wrapping_add(1);
        }
        self.queues[q].used_seen = seen;
        Ok(out)
    }

    /// One request on slot 0 of `queue`, waited for; its status.
    pub fn one(&mut self, q: usize, r: Request) -> io::Result<u8> {
        self.submit(q, &[(0, r)])?;
        let mut done = Vec::new();
        while done.is_empty() {
            done = self.wait(q)?;
        }
        Ok(done[0].status)
    }

    /// Reads `buf.len()` bytes at byte `offset` through `queue`; the status.
    pub fn read(&mut self, q: usize, offset: u64, buf: &mut [u8]) -> io::Result<u8> {
        let r = Request {
            kind: kind::IN,
            sector: offset / 512,
            len: buf.len() as u32,
        };
        let s = self.one(q, r)?;
        self.read_mem(self.slot_data(q, 0), buf)?;
        Ok(s)
    }

    /// Writes `data` at byte `offset` through `queue`; the status.
    pub fn write(&mut self, q: usize, offset: u64, data: &[u8]) -> io::Result<u8> {
        self.write_mem(self.slot_data(q, 0), data)?;
        let r = Request {
            kind: kind::OUT,
            sector: offset / 512,
            len: data.len() as u32,
        };
        self.one(q, r)
    }
}
