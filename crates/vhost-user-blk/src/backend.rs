//! The virtio-blk device behind `vhost-user-backend`'s daemon: features, configuration
//! space, and the queue threads' request loop.

use crate::request::{self, Limits, SECTOR};
use crate::stats::Stats;
use cryptblk_device::BlockDevice;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringMutex, VringT};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    EventConsumer, EventFlag, EventNotifier, new_event_consumer_and_notifier,
};

// Feature bits (virtio 1.2, 5.2.3 and 6).
const F_SIZE_MAX: u64 = 1 << 1;
const F_SEG_MAX: u64 = 1 << 2;
const F_RO: u64 = 1 << 5;
const F_BLK_SIZE: u64 = 1 << 6;
const F_FLUSH: u64 = 1 << 9;
const F_TOPOLOGY: u64 = 1 << 10;
const F_MQ: u64 = 1 << 12;
const F_DISCARD: u64 = 1 << 13;
const F_WRITE_ZEROES: u64 = 1 << 14;
const F_RING_INDIRECT_DESC: u64 = 1 << 28;
const F_RING_EVENT_IDX: u64 = 1 << 29;
const F_VERSION_1: u64 = 1 << 32;

/// Size of `struct virtio_blk_config` up to the secure-erase fields.
const CONFIG_BYTES: usize = 72;

pub(crate) type Memory = GuestMemoryAtomic<GuestMemoryMmap<()>>;

/// The device's fixed settings (from the server's builder).
pub(crate) struct Settings {
    pub(crate) queues: usize,
    pub(crate) queue_size: usize,
    pub(crate) seg_max: u32,
    pub(crate) size_max: u32,
    pub(crate) read_only: bool,
    pub(crate) busy_poll: Duration,
}

/// The device: one per server, shared by every connection in turn.
pub(crate) struct BlkBackend {
    pub(crate) dev: Arc<dyn BlockDevice>,
    pub(crate) queues: usize,
    pub(crate) queue_size: usize,
    pub(crate) seg_max: u32,
    pub(crate) size_max: u32,
    pub(crate) read_only: bool,
    pub(crate) limits: Limits,
    pub(crate) stats: Arc<Stats>,
    /// How long a queue thread watches its ring for the next request before it sleeps.
    pub(crate) busy_poll: Duration,
    event_idx: AtomicBool,
    mem: Mutex<Option<Memory>>,
    /// One bounce buffer per queue (each queue has its own thread).
    bounce: Vec<Mutex<Vec<u8>>>,
}

impl BlkBackend {
    pub(crate) fn new(
        dev: Arc<dyn BlockDevice>,
        s: Settings,
        limits: Limits,
        stats: Arc<Stats>,
    ) -> Self {
        BlkBackend {
            dev,
            queues: s.queues,
            queue_size: s.queue_size,
            seg_max: s.seg_max,
            size_max: s.size_max,
            read_only: s.read_only,
            limits,
            stats,
            busy_poll: s.busy_poll,
            event_idx: AtomicBool::new(false),
            mem: Mutex::new(None),
            bounce: (0..s.queues).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    /// `struct virtio_blk_config`, little-endian.
    pub(crate) fn config_space(&self) -> [u8; CONFIG_BYTES] {
        let mut c = [0u8; CONFIG_BYTES];
        let bs = self.dev.block_size();
        c[0..8].copy_from_slice(&(self.dev.size() / SECTOR).to_le_bytes());
        c[8..12].copy_from_slice(&self.size_max.to_le_bytes());
        c[12..16].copy_from_slice(&self.seg_max.to_le_bytes());
        // geometry (16..20) left zero: unused by modern drivers.
        c[20..24].copy_from_slice(&bs.to_le_bytes());
        c[24] = (bs / SECTOR as u32).trailing_zeros() as u8; // physical_block_exp
        c[26..28].copy_from_slice(&1u16.to_le_bytes()); // min_io_size, in blocks
        c[32] = 1; // writeback: the cache is flushed by VIRTIO_BLK_T_FLUSH
        c[34..36].copy_from_slice(&(self.queues as u16).to_le_bytes());
        let max_sectors = crate::MAX_DWZ_SECTORS.to_le_bytes();
        let max_segs = crate::MAX_DWZ_SEGMENTS.to_le_bytes();
        if self.dev.can_discard() {
            c[36..40].copy_from_slice(&max_sectors);
            c[40..44].copy_from_slice(&max_segs);
            c[44..48].copy_from_slice(&(bs / SECTOR as u32).to_le_bytes());
        }
        c[48..52].copy_from_slice(&max_sectors);
        c[52..56].copy_from_slice(&max_segs);
        c[56] = u8::from(self.dev.can_discard()); // write_zeroes_may_unmap
        c
    }

    /// Watches the available ring for up to `busy_poll`: true when a request came (saves
    /// the guest's kick and this thread's wake-up at low queue depth).
    fn poll_for_more(&self, vring: &VringMutex<Memory>) -> io::Result<bool> {
        if self.busy_poll.is_zero() {
            return Ok(false);
        }
        let mem = self.memory()?;
        let guard = mem.memory();
        let deadline = Instant::now() + self.busy_poll;
        loop {
            {
                let state = vring.get_ref();
                let q = state.get_queue();
                let avail = q
                    .avail_idx(&*guard, Ordering::Acquire)
                    .map_err(|e| io::Error::other(format!("virtqueue: {e}")))?;
                if avail.0 != q.next_avail() {
                    return Ok(true);
                }
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::hint::spin_loop();
        }
    }

    fn memory(&self) -> io::Result<Memory> {
        self.mem
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| io::Error::other("no guest memory table yet"))
    }

    /// Serves every available request of one queue, in order, and signals the guest when
    /// its notification policy asks for it. Requests complete in the order they were made
    /// available, so after a crash the frontend's used index says exactly which are done
    /// (QEMU redoes the rest on reconnect).
    fn process_queue(&self, index: usize, vring: &VringMutex<Memory>) -> io::Result<bool> {
        let mem = self.memory()?;
        let guard = mem.memory();
        let chains: Vec<(u16, Vec<Descriptor>, bool)> = {
            let mut state = vring.get_mut();
            let q = state.get_queue_mut();
            let iter = q
                .iter(guard.clone())
                .map_err(|e| io::Error::other(format!("virtqueue: {e}")))?;
            iter.map(|chain| {
                let head = chain.head_index();
                let descs: Vec<Descriptor> = chain.collect();
                // A chain that still says "next" after the iterator stopped was cut short: a
                // loop, an index past the table, or a bad indirect table.
                let truncated = descs.last().is_none_or(|d| d.has_next());
                (head, descs, truncated)
            })
            .collect()
        };
        if chains.is_empty() {
            return Ok(false);
        }
        let mut bounce = self.bounce[index].lock().unwrap_or_else(|p| p.into_inner());
        for (head, descs, truncated) in chains {
            let used = request::serve(
                &guard,
                &descs,
                truncated,
                &*self.dev,
                &self.limits,
                &self.stats,
                &mut bounce,
            );
            vring
                .add_used(head, used)
                .map_err(|e| io::Error::other(format!("virtqueue: {e}")))?;
        }
        if vring
            .needs_notification()
            .map_err(|e| io::Error::other(format!("virtqueue: {e}")))?
        {
            vring.signal_used_queue()?;
        }
        Ok(true)
    }
}

impl VhostUserBackend for BlkBackend {
    type Bitmap = ();
    type Vring = VringMutex<Memory>;

    fn num_queues(&self) -> usize {
        self.queues
    }

    fn max_queue_size(&self) -> usize {
        self.queue_size
    }

    fn features(&self) -> u64 {
        let mut f = F_VERSION_1
            | F_RING_INDIRECT_DESC
            | F_RING_EVENT_IDX
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | F_SIZE_MAX
            | F_SEG_MAX
            | F_BLK_SIZE
            | F_TOPOLOGY
            | F_FLUSH
            | F_MQ;
        if self.read_only {
            f |= F_RO;
        } else {
            f |= F_WRITE_ZEROES;
            if self.dev.can_discard() {
                f |= F_DISCARD;
            }
        }
        f
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Relaxed);
    }

    /// Exactly `size` bytes from `offset` (QEMU refuses any other length), zeros past the
    /// fields this device has.
    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let c = self.config_space();
        let mut out = vec![0u8; size as usize];
        let start = (offset as usize).min(c.len());
        let end = (offset as usize).saturating_add(size as usize).min(c.len());
        out[..end - start].copy_from_slice(&c[start..end]);
        out
    }

    fn update_memory(&self, mem: Memory) -> io::Result<()> {
        *self.mem.lock().unwrap_or_else(|p| p.into_inner()) = Some(mem);
        Ok(())
    }

    /// One thread per queue.
    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.queues).map(|q| 1u64 << q).collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Self::Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Err(io::Error::other(format!("unexpected event set {evset:?}")));
        }
        // Each thread has one queue: its vrings are that one, and the thread's number is
        // the queue's.
        let index = thread_id;
        let Some(vring) = vrings.get(device_event as usize) else {
            return Err(io::Error::other(format!("no queue event {device_event}")));
        };
        if self.event_idx.load(Relaxed) {
            // Serve until the queue is empty with notifications enabled again, so no kick
            // that came in between is lost.
            loop {
                vring
                    .disable_notification()
                    .map_err(|e| io::Error::other(format!("virtqueue: {e}")))?;
                self.process_queue(index, vring)?;
                if !vring
                    .enable_notification()
                    .map_err(|e| io::Error::other(format!("virtqueue: {e}")))?
                    && !self.poll_for_more(vring)?
                {
                    break;
                }
            }
        } else {
            while self.process_queue(index, vring)? && self.poll_for_more(vring)? {}
        }
        Ok(())
    }
}
