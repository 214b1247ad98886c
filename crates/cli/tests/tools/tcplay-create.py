#!/usr/bin/env python3
"""Runs tcplay on a terminal of its own (it reads passphrases only from /dev/tty) and
answers its prompts. usage: tcplay-create.py PASSPHRASE HIDDEN_PASSPHRASE HIDDEN_SIZE --
TCPLAY_ARGS...  Exits with tcplay's status (124 if it is still waiting after 120 s); its
output goes to stdout."""
import os, pty, re, signal, sys, termios, time

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
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp(args[0], args)
    deadline = time.monotonic() + TIMEOUT

    def expired(*_):
        os.kill(pid, signal.SIGKILL)
        sys.stdout.buffer.write(b"\ntcplay-create.py: tcplay still waiting after %d s\n" % TIMEOUT)
        sys.exit(124)

    signal.signal(signal.SIGALRM, expired)
    signal.alarm(TIMEOUT)
    seen = b""
    answered = 0
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
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
