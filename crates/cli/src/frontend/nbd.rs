//! `open --nbd unix:PATH | tcp:HOST:PORT`: the NBD server (crates/nbd) on a unix socket
//! (0600 unless `--socket-mode`/`--socket-group` share it) or a loopback TCP port.

use super::{Control, Frontend, OpenArgs, Started};
use crate::error::{CliError, CliResult};
use crate::rundir::{self, SocketAccess};
use crate::unlock::VolumeInfo;
use cryptblk_device::BlockDevice;
use cryptblk_nbd::{NbdServer, ShutdownHandle};
use cryptblk_volume::Volume;
use serde_json::{Value, json};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

enum Listen {
    Unix(PathBuf),
    Tcp(String),
}

fn parse_nbd(spec: &str) -> CliResult<Listen> {
    if let Some(p) = spec.strip_prefix("unix:") {
        return Ok(Listen::Unix(PathBuf::from(p)));
    }
    if let Some(a) = spec.strip_prefix("tcp:") {
        return Ok(Listen::Tcp(a.to_string()));
    }
    Err(CliError::usage(format!(
        "--nbd takes unix:PATH or tcp:HOST:PORT, not '{spec}'"
    )))
}

enum Bound {
    /// The listener, its path, and the socket's identity (removed at exit only if it is
    /// still ours).
    Unix(UnixListener, PathBuf, Option<(u64, u64)>),
    Tcp(std::net::TcpListener),
}

/// Binds the NBD listener.
fn bind_nbd(listen: &Listen, access: SocketAccess) -> CliResult<Bound> {
    Ok(match listen {
        Listen::Unix(p) => {
            rundir::clear_stale_socket(p)?;
            let l = rundir::bind_socket(p, access)?;
            Bound::Unix(l, p.clone(), rundir::identity(p))
        }
        Listen::Tcp(addr) => {
            let l = std::net::TcpListener::bind(addr)
                .map_err(|e| CliError::usage(format!("{addr}: {e}")))?;
            let ip = l
                .local_addr()
                .map_err(|e| CliError::usage(e.to_string()))?
                .ip();
            if !ip.is_loopback() {
                return Err(CliError::usage(format!(
                    "refusing to serve on non-loopback address {ip}"
                )));
            }
            Bound::Tcp(l)
        }
    })
}

/// `--nbd SPEC`: where to listen and who may connect.
pub(super) struct NbdFrontend {
    listen: Listen,
    access: SocketAccess,
}

impl NbdFrontend {
    pub(super) fn parse(spec: &str, a: &OpenArgs) -> CliResult<Self> {
        Ok(NbdFrontend {
            listen: parse_nbd(spec)?,
            access: rundir::socket_access(a.socket_mode.as_deref(), a.socket_group.as_deref())?,
        })
    }
}

struct NbdControl(ShutdownHandle);

impl Control for NbdControl {
    fn stop(&self) -> Result<(), String> {
        self.0.shutdown();
        Ok(())
    }
    fn status(&self) -> Value {
        let n = self.0.stats();
        json!({"clients": n.connections_active, "clients_total": n.connections_total, "errors": n.errors})
    }
}

impl Frontend for NbdFrontend {
    fn start(
        self: Box<Self>,
        a: &OpenArgs,
        _dir: &Path,
        vol: Arc<Volume>,
        _info: &VolumeInfo,
    ) -> CliResult<Started> {
        let server = NbdServer::builder()
            .export(a.name.clone(), vol as Arc<dyn BlockDevice>)
            .read_only(a.vol.read_only)
            .threads_per_connection(a.threads)
            .busy_poll(std::time::Duration::from_micros(a.busy_poll))
            .build()
            .map_err(|e| CliError::usage(format!("NBD server: {e}")))?;
        let where_ = match &self.listen {
            Listen::Unix(p) => format!("unix:{}", p.display()),
            Listen::Tcp(t) => format!("tcp:{t}"),
        };
        // Bound before readiness is announced, so "ready" means clients can connect.
        let bound = bind_nbd(&self.listen, self.access)?;
        let control = Arc::new(NbdControl(server.shutdown_handle()));
        let nbd_err = |e: std::io::Error| CliError::usage(format!("NBD server: {e}"));
        Ok(Started {
            desc: format!("nbd {where_}"),
            summary: format!("nbd {where_}"),
            device_node: None,
            control,
            run: Box::new(move || match bound {
                Bound::Unix(l, p, id) => {
                    let r = server.serve_unix_listener(l);
                    rundir::remove_if_same(&p, id);
                    r.map_err(nbd_err)
                }
                Bound::Tcp(l) => server.serve_tcp_listener(l).map_err(nbd_err),
            }),
        })
    }
}
