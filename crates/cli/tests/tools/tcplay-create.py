#!/usr/bin/env python3
"""Runs tcplay on a terminal of its own (it reads passphrases only from /dev/tty) and
answers its prompts. usage: tcplay-create.py PASSPHRASE HIDDEN_PASSPHRASE HIDDEN_SIZE --
TCPLAY_ARGS...  Exits with tcplay's status (124 if it is still waiting after 120 s); its
output goes to stdout.

tcplay's stdout and stderr are a pipe, not the terminal: when a session leader exits, the
kernel hangs its terminal up and may drop output still queued there (an `--info` lost its
last lines that way). The terminal is only tcplay's /dev/tty, where it reads passphrases."""
import os, pty, re, select, signal, sys, termios, time

TIMEOUT = 120


def main():
    sep = sys.argv.index("--")
    pw, hidden_pw, hidden_size = sys.argv[1:sep]
    args = ["tcplay"] + sys.argv[sep + 1:]
    # Passphrase prompts come in this order: the volume's twice, then (with -g) the hidden
    # volume's twice. Each pattern matches a prompt at the very end of the output.
    phrases = [pw, pw] + ([hidden_pw, hidden_pw] if "-g" in args else [])
    answers = [
        (rb"passphrase[^\n]*:\s*$", None),
        (rb"size[^\n]*:\s*$", hidden_size),
        (rb"\(y/n\)\s*$", "y"),
    ]
    out_r, out_w = os.pipe()
    pid, fd = pty.fork()
    if pid == 0:
        os.close(out_r)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.close(out_w)
        os.execvp(args[0], args)
    os.close(out_w)
    deadline = time.monotonic() + TIMEOUT

    def expired(*_):
        os.kill(pid, signal.SIGKILL)
        sys.stdout.buffer.write(b"\ntcplay-create.py: tcplay still waiting after %d s\n" % TIMEOUT)
        sys.exit(124)

    signal.signal(signal.SIGALRM, expired)
    signal.alarm(TIMEOUT)
    seen = b""
    answered = 0
    # The terminal echoes what we type; the pipe carries tcplay's output and prompts,
    # and its end of file (every copy of the write end closed) is tcplay's end.
    open_fds = [out_r, fd]
    while out_r in open_fds:
        ready, _, _ = select.select(open_fds, [], [])
        chunk = b""
        for r in ready:
            try:
                data = os.read(r, 4096)
            except OSError:
                data = b""
            if not data:
                open_fds.remove(r)
            elif r == out_r:
                chunk += data
        if not chunk:
            continue
        sys.stdout.buffer.write(chunk)
        seen += chunk
        tail = seen[answered:]
        for pat, ans in answers:
            if re.search(pat, tail, re.I):
                if ans is None:
                    ans = phrases.pop(0) if phrases else ""
                    # tcplay prints the prompt, then turns echo off with TCSAFLUSH, which
                    # drops input typed before: wait for echo to go off first.
                    while termios.tcgetattr(fd)[3] & termios.ECHO:
                        if time.monotonic() > deadline:
                            expired()
                        time.sleep(0.005)
                os.write(fd, ans.encode() + b"\n")
                answered = len(seen)
                break
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))


main()
