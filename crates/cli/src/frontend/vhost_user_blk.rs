//! `open --vhost-user-blk SOCKET`: the volume as a VM's virtio-blk disk over a vhost-user
//! socket (crates/vhost-user-blk). The socket is 0600 like NBD's unless `--socket-mode` /
//! `--socket-group` share it; whoever connects reads and writes the plaintext. The server
//! outlives the VM's connection: a VM that reconnects (QEMU's `reconnect=` chardev, after a
//! restart of this process or of the VM) is served again on the same socket.

use super::{Control, Frontend, OpenArgs, Started};
use crate::error::{CliError, CliResult};
use crate::rundir::{self, SocketAccess};
use cryptblk_device::BlockDevice;
use cryptblk_vhost_user_blk::{ShutdownHandle, VhostUserBlkServer};
use cryptblk_volume::{Volume, VolumeInfo};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

pub(super) struct VhostUserBlkFrontend {
    socket: PathBuf,
    access: SocketAccess,
}

impl VhostUserBlkFrontend {
    pub(super) fn parse(socket: &Path, a: &OpenArgs) -> CliResult<Self> {
        rundir::check_socket_path_length(socket)?;
        Ok(VhostUserBlkFrontend {
            socket: socket.to_path_buf(),
            access: rundir::socket_access(a.socket_mode.as_deref(), a.socket_group.as_deref())?,
        })
    }
}

/// Virtqueues offered when `--queues` is not given: one per CPU, as QEMU's
/// vhost-user-blk-pci asks for one per vCPU by default and refuses a backend with fewer.
fn default_queues() -> u16 {
    std::thread::available_parallelism()
        .map(|n| n.get().clamp(1, 64) as u16)
        .unwrap_or(1)
}

struct VhostControl {
    handle: ShutdownHandle,
    fixed: Value,
}

impl Control for VhostControl {
    /// The VM's connection is cut after the request in progress; QEMU then holds the
    /// guest's I/O until a server is back on the socket (with `reconnect=`) or fails it.
    fn stop(&self) -> Result<(), String> {
        self.handle.shutdown();
        Ok(())
    }
    fn status(&self) -> Value {
        let s = self.handle.stats();
        let mut v = self.fixed.clone();
        v["clients"] = s.connected.load(Relaxed).into();
        v["clients_total"] = s.connections_total.load(Relaxed).into();
        v["reads"] = s.reads.load(Relaxed).into();
        v["writes"] = s.writes.load(Relaxed).into();
        v["flushes"] = s.flushes.load(Relaxed).into();
        v["bytes_read"] = s.bytes_read.load(Relaxed).into();
        v["bytes_written"] = s.bytes_written.load(Relaxed).into();
        v["errors"] = s.errors.load(Relaxed).into();
        v
    }
    fn can_resize(&self) -> Result<(), String> {
        Err(
            "a vhost-user-blk disk keeps the size the VM attached with (telling QEMU of a \
             new capacity needs VHOST_USER_BACKEND_CONFIG_CHANGE_MSG, which rust-vmm's vhost \
             crate cannot send yet): close, resize, and reopen the volume; the VM reconnects"
                .into(),
        )
    }
}

impl Frontend for VhostUserBlkFrontend {
    fn start(
        self: Box<Self>,
        a: &OpenArgs,
        _dir: &Path,
        vol: Arc<Volume>,
        info: &VolumeInfo,
    ) -> CliResult<Started> {
        let queues = a.ublk.queues.unwrap_or_else(default_queues);
        // The guest's serial (/dev/disk/by-id/virtio-...): the volume's UUID, else its name.
        let id = info.uuid.clone().unwrap_or_else(|| a.name.clone());
        rundir::clear_stale_socket(&self.socket)?;
        let listener = rundir::bind_socket(&self.socket, self.access)?;
        let socket_id = rundir::identity(&self.socket);
        let server = VhostUserBlkServer::builder(vol as Arc<dyn BlockDevice>)
            .queues(queues)
            .read_only(a.vol.read_only)
            .id(id.clone())
            .busy_poll(std::time::Duration::from_micros(a.busy_poll))
            .build(listener)
            .map_err(|e| CliError::usage(format!("vhost-user-blk: {e}")))?;
        let where_ = format!("vhost-user-blk {}", self.socket.display());
        let control = Arc::new(VhostControl {
            handle: server.shutdown_handle(),
            fixed: json!({"socket": self.socket.display().to_string(), "queues": queues, "serial": id}),
        });
        let socket = self.socket;
        Ok(Started {
            summary: format!("{where_} ({queues} queues)"),
            desc: where_,
            device_node: None,
            control,
            run: Box::new(move || {
                let r = server.run();
                rundir::remove_if_same(&socket, socket_id);
                r.map_err(|e| CliError::usage(format!("vhost-user-blk: {e}")))
            }),
        })
    }
}
