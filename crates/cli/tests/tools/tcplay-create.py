#!/usr/bin/env python3
"""Runs `tcplay -c` on a terminal of its own (it reads passphrases only from a tty) and
answers its prompts: usage: tcplay-create.py PASSPHRASE HIDDEN_PASSPHRASE HIDDEN_SIZE --
TCPLAY_ARGS... Exits with tcplay's status; its output goes to stdout."""
import os, pty, re, sys

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
        # Answer each prompt once, as soon as it appears at the end of the output.
        tail = seen[answered:]
        for pat, ans in answers:
            if re.search(pat, tail, re.I):
                ans = ans if ans is not None else (phrases.pop(0) if phrases else "")
                os.write(fd, ans.encode() + b"\n")
                answered = len(seen)
                break
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))

main()
