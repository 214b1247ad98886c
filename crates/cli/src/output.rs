//! Standard output for the commands' results. A reader that goes away early
//! (`cryptblk status NAME | head -n1`) ends the process as it ends C tools such as
//! cryptsetup, by SIGPIPE, instead of the panic `println!` gives on a closed pipe (std
//! ignores SIGPIPE so that sockets report EPIPE; that stays so for every other file).

use std::io::Write;

/// Writes `args` to stdout; a closed pipe ends the process as SIGPIPE would.
pub(crate) fn write(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let r = out.write_fmt(args).and_then(|()| out.flush());
    match r {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => broken_pipe(),
        // Anything else (a full disk behind a redirection) is an error println! would
        // have panicked on: say it plainly and fail.
        Err(e) => {
            eprintln!("cryptblk: cannot write to standard output: {e}");
            std::process::exit(crate::error::EXIT_USAGE);
        }
    }
}

#[allow(unsafe_code)]
fn broken_pipe() -> ! {
    // SAFETY: restoring the default action of SIGPIPE and raising it touches no memory of
    // ours; the default action ends the process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    // Not reached; for a SIGPIPE the caller blocked, the shell's code for it.
    std::process::exit(128 + libc::SIGPIPE)
}

/// `print!` to stdout, ending the process quietly when the reader has gone.
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::write(format_args!($($arg)*)) };
}

/// `println!` to stdout, ending the process quietly when the reader has gone.
macro_rules! outln {
    () => { $crate::output::write(format_args!("\n")) };
    ($($arg:tt)*) => {{
        $crate::output::write(format_args!("{}\n", format_args!($($arg)*)))
    }};
}
