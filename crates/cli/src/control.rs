//! The control socket of a served volume (`RUN_DIR/NAME.ctl`, 0600 in the private run
//! directory): one request line, answered by one reply line (`close` by two: `closing
//! SECONDS` once the stop is accepted, then `closed` or the error it ended with). Both
//! sides read and write the protocol through [`Request`] and [`Reply`]; [`ask`] is the
//! client.

use crate::error::{CliError, CliResult, EXIT_NO_DEVICE, EXIT_USAGE, io_err};
use serde_json::Value;
use std::fmt;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use zeroize::Zeroizing;

/// What a client asks a serving process.
pub(crate) enum Request {
    /// `status`: a JSON object.
    Status,
    /// `close`: drain, flush, exit.
    Close,
    /// `suspend`: wipe the keys, hold the I/O (`luksSuspend`).
    Suspend,
    /// `resume HEX [SLOT]`: unlock again with this passphrase (`luksResume`).
    Resume {
        passphrase: Zeroizing<Vec<u8>>,
        key_slot: Option<u32>,
    },
    /// `resize BYTES|max`: the new size, or all the device holds.
    Resize(Option<u64>),
    /// `reencrypt HEX JSON`: start (or take up) an online reencryption.
    Reencrypt {
        passphrase: Zeroizing<Vec<u8>>,
        job: Value,
    },
    /// `reencrypt-stop`: stop the job after its step.
    ReencryptStop,
}

/// What a serving process answers.
#[derive(Debug, PartialEq)]
pub(crate) enum Reply {
    /// The `status` object.
    Status(Value),
    /// The close is accepted; the server may take this many seconds (an older server
    /// said a bare `closing`).
    Closing(Option<u64>),
    /// The close ended cleanly.
    Closed,
    /// The close is refused for now (a FUSE file still open).
    Busy(String),
    /// The new size in bytes.
    Resized(u64),
    /// `suspend` done.
    Suspended,
    /// `resume` done.
    Resumed,
    /// `reencrypt` started (its metadata written).
    Started,
    /// `reencrypt-stop` taken.
    Stopping,
    /// Refused or failed: the exit code the client should end with, and why.
    Error { code: i32, message: String },
}

impl Request {
    /// Parses a request line (without its newline).
    pub(crate) fn parse(line: &str) -> Result<Request, Reply> {
        let bad = |why: &str| Reply::Error {
            code: EXIT_USAGE,
            message: why.to_string(),
        };
        let hex = |h: &str| {
            hex::decode(h)
                .map(Zeroizing::new)
                .map_err(|_| bad("bad passphrase encoding"))
        };
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        Ok(match (word, rest) {
            ("status", "") => Request::Status,
            ("close", "") => Request::Close,
            ("suspend", "") => Request::Suspend,
            ("reencrypt-stop", "") => Request::ReencryptStop,
            ("resume", r) => {
                let mut words = r.split_whitespace();
                Request::Resume {
                    passphrase: hex(words.next().unwrap_or(""))?,
                    key_slot: words.next().and_then(|w| w.parse().ok()),
                }
            }
            ("resize", "max") => Request::Resize(None),
            ("resize", n) => Request::Resize(Some(
                n.parse().map_err(|_| bad(&format!("bad size '{n}'")))?,
            )),
            ("reencrypt", r) => {
                let (pass, json) = r.split_once(' ').unwrap_or((r, ""));
                Request::Reencrypt {
                    passphrase: hex(pass)?,
                    job: serde_json::from_str(json)
                        .map_err(|e| bad(&format!("bad reencrypt request: {e}")))?,
                }
            }
            _ => return Err(bad("unknown command")),
        })
    }

    /// The line to send (secrets in it: keep it in a `Zeroizing` string).
    pub(crate) fn line(&self) -> Zeroizing<String> {
        Zeroizing::new(match self {
            Request::Status => "status".into(),
            Request::Close => "close".into(),
            Request::Suspend => "suspend".into(),
            Request::ReencryptStop => "reencrypt-stop".into(),
            Request::Resume {
                passphrase,
                key_slot,
            } => format!(
                "resume {}{}",
                Zeroizing::new(hex::encode(&**passphrase)).as_str(),
                key_slot.map_or(String::new(), |s| format!(" {s}"))
            ),
            Request::Resize(n) => format!("resize {}", n.map_or("max".into(), |b| b.to_string())),
            Request::Reencrypt { passphrase, job } => format!(
                "reencrypt {} {job}",
                Zeroizing::new(hex::encode(&**passphrase)).as_str()
            ),
        })
    }
}

impl Reply {
    /// A failure as the reply that carries it (one line).
    pub(crate) fn error(e: &CliError) -> Reply {
        Reply::Error {
            code: e.code,
            message: e.message.replace('\n', " "),
        }
    }

    /// `Ok(ok)` as it is, an error as [`Reply::error`].
    pub(crate) fn of(r: CliResult<Reply>) -> Reply {
        r.unwrap_or_else(|e| Reply::error(&e))
    }

    /// Parses a reply line (an empty one: the server exited without a word).
    pub(crate) fn parse(line: &str) -> Reply {
        let line = line.trim();
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let unexpected = || Reply::Error {
            code: EXIT_USAGE,
            message: format!("unexpected answer '{line}'"),
        };
        match (word, rest) {
            ("closing", "") => Reply::Closing(None),
            ("closing", n) => n
                .parse()
                .map(|n| Reply::Closing(Some(n)))
                .unwrap_or_else(|_| unexpected()),
            ("closed", "") => Reply::Closed,
            ("busy:", why) => Reply::Busy(why.to_string()),
            ("resized", n) => n
                .parse()
                .map(Reply::Resized)
                .unwrap_or_else(|_| unexpected()),
            ("suspended", "") => Reply::Suspended,
            ("resumed", "") => Reply::Resumed,
            ("started", "") => Reply::Started,
            ("stopping", "") => Reply::Stopping,
            ("error", rest) => {
                let (code, message) = rest.split_once(": ").unwrap_or(("1", rest));
                Reply::Error {
                    code: code.trim_end_matches(':').parse().unwrap_or(1),
                    message: message.to_string(),
                }
            }
            _ if line.starts_with('{') => serde_json::from_str(line)
                .map(Reply::Status)
                .unwrap_or_else(|_| unexpected()),
            _ => unexpected(),
        }
    }

    /// `Ok` if this is `expect`, the error it carries (or an unexpected answer) else.
    pub(crate) fn expect(self, expect: Reply) -> CliResult<()> {
        match self {
            r if r == expect => Ok(()),
            r => Err(r.into_error()),
        }
    }

    /// The error this reply is (any reply but an error is an unexpected one here).
    pub(crate) fn into_error(self) -> CliError {
        match self {
            Reply::Error { code, message } => CliError::new(code, message),
            r => CliError::usage(format!("unexpected answer '{r}'")),
        }
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Status(v) => write!(f, "{v}"),
            Reply::Closing(None) => f.write_str("closing"),
            Reply::Closing(Some(n)) => write!(f, "closing {n}"),
            Reply::Closed => f.write_str("closed"),
            Reply::Busy(why) => write!(f, "busy: {why}"),
            Reply::Resized(n) => write!(f, "resized {n}"),
            Reply::Suspended => f.write_str("suspended"),
            Reply::Resumed => f.write_str("resumed"),
            Reply::Started => f.write_str("started"),
            Reply::Stopping => f.write_str("stopping"),
            Reply::Error { code, message } => write!(f, "error {code}: {message}"),
        }
    }
}

/// Asks the volume `name` served from `dir` one request; its reply.
pub(crate) fn ask(dir: &Path, name: &str, req: &Request) -> CliResult<Reply> {
    crate::rundir::check_name(name)?;
    let p = dir.join(format!("{name}.ctl"));
    let mut s = UnixStream::connect(&p).map_err(|_| not_active(name))?;
    s.write_all(format!("{}\n", req.line().as_str()).as_bytes())
        .map_err(|e| io_err(&p, e))?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| io_err(&p, e))?;
    Ok(Reply::parse(&out))
}

/// The error for a name nothing serves.
pub(crate) fn not_active(name: &str) -> CliError {
    CliError::new(EXIT_NO_DEVICE, format!("Device {name} is not active."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_round_trip() {
        for r in [
            Reply::Status(serde_json::json!({"name": "v", "clients": 2})),
            Reply::Closing(None),
            Reply::Closing(Some(60)),
            Reply::Closed,
            Reply::Busy("the FUSE file is open".into()),
            Reply::Resized(1 << 30),
            Reply::Suspended,
            Reply::Resumed,
            Reply::Started,
            Reply::Stopping,
            Reply::Error {
                code: 5,
                message: "the volume is closing".into(),
            },
        ] {
            assert_eq!(Reply::parse(&format!("{r}\n")), r);
        }
        assert!(matches!(Reply::parse(""), Reply::Error { .. }));
        assert!(matches!(Reply::parse("closing soon"), Reply::Error { .. }));
    }

    #[test]
    fn requests_round_trip_and_bad_ones_are_errors() {
        let pass = || Zeroizing::new(b"pass phrase".to_vec());
        for r in [
            Request::Status,
            Request::Close,
            Request::Suspend,
            Request::ReencryptStop,
            Request::Resize(None),
            Request::Resize(Some(4096)),
            Request::Resume {
                passphrase: pass(),
                key_slot: Some(3),
            },
            Request::Reencrypt {
                passphrase: pass(),
                job: serde_json::json!({"resilience": "checksum"}),
            },
        ] {
            let line = r.line();
            let again = Request::parse(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            assert_eq!(*again.line(), *line);
        }
        for bad in [
            "",
            "closex",
            "resize ten",
            "resume zz",
            "reencrypt 00 {",
            "status now",
        ] {
            assert!(Request::parse(bad).is_err(), "{bad:?}");
        }
    }
}
