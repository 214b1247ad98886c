#!/usr/bin/env python3
"""Sends one command to a Ceph monitor through librados' C API (ctypes), as the `ceph`
tool does through its Python bindings, which are built for one Python version only: this
runs on any python3 with librados.so.2 (e.g. Debian's Ceph carried to another distribution).

usage: mon_command.py CEPH_CONF JSON   e.g. '{"prefix": "osd pool create", "pool": "rbd"}'
Prints the monitor's output; exits 1 with its message if the command fails.
"""
import ctypes
import os
import sys
import time

conf, cmd = sys.argv[1], sys.argv[2]
# CEPH_LIBRARY_PATH: a carried Ceph's libraries (scripts/device-bundle.sh). The loader
# reads LD_LIBRARY_PATH at start only, so this script starts again with it set.
lib_dir = os.environ.get("CEPH_LIBRARY_PATH")
if lib_dir and os.environ.get("LD_LIBRARY_PATH") != lib_dir:
    os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, "LD_LIBRARY_PATH": lib_dir})
rados = ctypes.CDLL("librados.so.2")
p, size_t = ctypes.c_void_p, ctypes.c_size_t
rados.rados_create.argtypes = [ctypes.POINTER(p), ctypes.c_char_p]
rados.rados_conf_read_file.argtypes = [p, ctypes.c_char_p]
rados.rados_conf_set.argtypes = [p, ctypes.c_char_p, ctypes.c_char_p]
rados.rados_connect.argtypes = [p]
rados.rados_shutdown.argtypes = [p]
rados.rados_buffer_free.argtypes = [p]
rados.rados_mon_command.argtypes = [
    p, ctypes.POINTER(ctypes.c_char_p), size_t, ctypes.c_char_p, size_t,
    ctypes.POINTER(p), ctypes.POINTER(size_t), ctypes.POINTER(p), ctypes.POINTER(size_t),
]


def check(r, what):
    if r < 0:
        sys.exit(f"mon_command.py: {what}: error {-r}")


def mon_command():
    """(return code, output, status message) of one connection's try."""
    cluster = p()
    check(rados.rados_create(ctypes.byref(cluster), None), "rados_create")
    check(rados.rados_conf_read_file(cluster, conf.encode()), f"reading {conf}")
    for k in (b"client_mount_timeout", b"rados_mon_op_timeout"):
        rados.rados_conf_set(cluster, k, b"20")
    check(rados.rados_connect(cluster), "connecting to the cluster")
    cmds = (ctypes.c_char_p * 1)(cmd.encode())
    out, outlen, outs, outslen = p(), size_t(), p(), size_t()
    r = rados.rados_mon_command(cluster, cmds, 1, b"", 0, ctypes.byref(out),
                                ctypes.byref(outlen), ctypes.byref(outs), ctypes.byref(outslen))
    text = ctypes.string_at(out, outlen.value).decode() if out.value else ""
    status = ctypes.string_at(outs, outslen.value).decode() if outs.value else ""
    for b in (out, outs):
        if b.value:
            rados.rados_buffer_free(b)
    rados.rados_shutdown(cluster)
    return r, text, status


# A monitor that has just started can answer "wrong fsid" until it has formed its quorum
# (the `ceph` tool waits that out too): tried again for up to 20 s.
for _ in range(100):
    r, text, status = mon_command()
    if not (r == -1 and "wrong fsid" in status):
        break
    time.sleep(0.2)
if r < 0:
    sys.exit(f"mon_command.py: {cmd}: error {-r}: {status}")
print(text or status)
