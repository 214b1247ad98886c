//! `open --nbd unix:PATH | tcp:HOST:PORT`: the NBD server (crates/nbd) on a unix socket
//! (0600 unless `--socket-mode`/`--socket-group` share it) or a TCP port: loopback, or any
//! address with TLS required and client certificates (`--tls-ca`), or with an explicit
//! choice to serve whoever connects (`--tls-no-client-auth`, `--insecure-listen`).

use super::{Control, Frontend, OpenArgs, Started};
use crate::error::{CliError, CliResult};
use crate::rundir::{self, SocketAccess};
use cryptblk_device::BlockDevice;
use cryptblk_nbd::{NbdServer, NbdTls, ShutdownHandle, TlsMode};
use cryptblk_volume::Volume;
use cryptblk_volume::VolumeInfo;
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
        let p = PathBuf::from(p);
        rundir::check_socket_path_length(&p)?;
        return Ok(Listen::Unix(p));
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

/// `--tls`: whether NBD clients must, may or cannot switch to TLS.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TlsArg {
    /// Only clients that switch to TLS (NBD_OPT_STARTTLS) are served.
    Required,
    /// Clients may switch to TLS; plaintext clients are served too.
    Optional,
    /// No TLS.
    Off,
}

/// The TLS identity and mode from `--tls`, `--tls-cert`, `--tls-key`, `--tls-ca`; loaded
/// before anything is unlocked, so a bad file fails at once.
fn tls_config(a: &OpenArgs) -> CliResult<Option<(NbdTls, TlsMode)>> {
    let mode = match (a.tls, &a.tls_cert) {
        (Some(TlsArg::Off), _) | (None, None) => return Ok(None),
        (Some(TlsArg::Optional), _) => TlsMode::Optional,
        (Some(TlsArg::Required), _) | (None, Some(_)) => TlsMode::Required,
    };
    let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) else {
        return Err(CliError::usage(
            "--tls needs the server's certificate and key: --tls-cert PEM --tls-key PEM",
        ));
    };
    let tls = NbdTls::from_pem_files(cert, key, a.tls_ca.as_deref())
        .map_err(|e| CliError::usage(format!("TLS: {e}")))?;
    Ok(Some((tls, mode)))
}

/// Who may be served on a non-loopback address, from the TLS options.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum RemoteClients {
    /// Nobody: loopback only (plaintext, optional TLS, or TLS without client certificates
    /// nobody asked for explicitly).
    Refused,
    /// TLS clients holding a certificate signed by `--tls-ca`.
    Authenticated,
    /// Anyone who can connect, over TLS (`--tls-no-client-auth`).
    AnyTls,
    /// Anyone, in plaintext (`--insecure-listen`).
    Anyone,
}

impl RemoteClients {
    fn of(a: &OpenArgs, tls: Option<&(NbdTls, TlsMode)>) -> RemoteClients {
        let required = matches!(tls, Some((_, TlsMode::Required)));
        if a.insecure_listen {
            RemoteClients::Anyone
        } else if required && a.tls_ca.is_some() {
            RemoteClients::Authenticated
        } else if required && a.tls_no_client_auth {
            RemoteClients::AnyTls
        } else {
            RemoteClients::Refused
        }
    }
}

/// Binds the NBD listener; a non-loopback TCP address only for the clients `remote` allows.
fn bind_nbd(listen: &Listen, access: SocketAccess, remote: RemoteClients) -> CliResult<Bound> {
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
                match remote {
                    RemoteClients::Refused => {
                        return Err(CliError::usage(format!(
                            "refusing to serve on non-loopback address {ip} to clients nobody \
                             identifies: give --tls-cert, --tls-key and --tls-ca (clients must \
                             hold a certificate signed by that CA), or say who may connect \
                             (--tls-no-client-auth: anyone, over TLS; --insecure-listen: \
                             anyone, in plaintext)"
                        )));
                    }
                    RemoteClients::AnyTls => eprintln!(
                        "warning: serving {addr} over TLS without client certificates \
                         (--tls-no-client-auth): anyone who can connect reads and writes the \
                         volume"
                    ),
                    RemoteClients::Anyone => eprintln!(
                        "warning: serving {addr} in plaintext (--insecure-listen): anyone who \
                         can connect reads and writes the volume"
                    ),
                    RemoteClients::Authenticated => {}
                }
            }
            Bound::Tcp(l)
        }
    })
}

/// `--nbd SPEC`: where to listen and who may connect.
pub(super) struct NbdFrontend {
    listen: Listen,
    access: SocketAccess,
    tls: Option<(NbdTls, TlsMode)>,
}

impl NbdFrontend {
    pub(super) fn parse(spec: &str, a: &OpenArgs) -> CliResult<Self> {
        Ok(NbdFrontend {
            listen: parse_nbd(spec)?,
            access: rundir::socket_access(a.socket_mode.as_deref(), a.socket_group.as_deref())?,
            tls: tls_config(a)?,
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
        let mut builder = NbdServer::builder()
            .export(a.name.clone(), vol as Arc<dyn BlockDevice>)
            .read_only(a.vol.read_only)
            .threads_per_connection(a.threads())
            .busy_poll(std::time::Duration::from_micros(a.busy_poll))
            .allow_remote(a.insecure_listen || a.tls_no_client_auth);
        let mut where_ = match &self.listen {
            Listen::Unix(p) => format!("unix:{}", p.display()),
            Listen::Tcp(t) => format!("tcp:{t}"),
        };
        let remote = RemoteClients::of(a, self.tls.as_ref());
        if let Some((tls, mode)) = self.tls {
            where_.push_str(match mode {
                TlsMode::Required => " (TLS required)",
                _ => " (TLS optional)",
            });
            builder = builder.tls(tls, mode);
        }
        let server = builder
            .build()
            .map_err(|e| CliError::usage(format!("NBD server: {e}")))?;
        // Bound before readiness is announced, so "ready" means clients can connect.
        let bound = bind_nbd(&self.listen, self.access, remote)?;
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
