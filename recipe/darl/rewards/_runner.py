"""The child process of the code reward: runs one model-written program and returns its outputs, never a verdict.

    python -I _runner.py        (started by code_reward.Candidate; standard library only)

Protocol, one JSON document per line. The parent writes a header, {"code", "kind": "stdin" | "call", "name",
"memory_mb", "cpu_s", "processes", "sandbox": {"level", "root", "uid", "keep", "shared_uid"}}; the child answers
{"ready": level, "filter": "on" | "off: <why>"} (at the limits level with "writes": what refuses writes outside
the folder; with "why" where namespaces were asked and not had; or
{"error": ...}) before any of the program's code runs, then
{"loaded": true} (or {"error": name}) once the program is compiled and, for calls, its top level has run; then one
answer per request: {"stdin": text} -> {"stdout": text, "exit": code}, or {"args": [...]} -> {"value": v} |
{"error": name} for the named function (or `Solution().<name>`). Values travel in the tagged encoding of `encode`
(exact plain types only). The expected outputs never reach this process. Everything after the ready line may be the
program's own writing (it can write on any descriptor): the parent bounds what it reads and decides nothing from it
but the outputs it compares.

Isolation: "namespaces" or "limits" (docs/rewards.md, "Isolation"), both with resource limits, a syscall filter and,
under root, a uid of its own; "limits" also with Landlock where the kernel has it (else a stricter filter).
"""

import ctypes
import errno
import io
import json
import math
import os
import resource
import sys

PRELUDE = (  # what LiveCodeBench-style and HumanEval solutions commonly assume is already imported
    "import sys, os, math, re, heapq, bisect, itertools, functools, collections, string, random, copy, operator\n"
    "from typing import *\n"
    "from collections import *\n"
    "from itertools import *\n"
    "from functools import *\n"
    "from heapq import *\n"
    "from bisect import *\n"
)
FILE_BYTES = 16 * 1024 * 1024


def encode(value, depth: int = 0):
    """A plain value as JSON with tags for what JSON lacks; TypeError for anything else (exact types only)."""
    if depth > 100:
        raise TypeError("nested too deep")
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return value if math.isfinite(value) else {"__t": "float", "v": repr(value)}
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind in (tuple, set, frozenset):
        return {"__t": kind.__name__, "v": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"__t": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise TypeError(f"not a plain value: {kind.__name__}")


MAX_ELEMENTS = 1_000_000  # values in one answer
MAX_DEPTH = 100


def decode(data, deadline=None, clock=None):
    """The value `encode` wrote. `deadline` (a `clock()` time, default time.monotonic) bounds the time it takes;
    more than MAX_ELEMENTS values or MAX_DEPTH levels raise ValueError. The deadline is checked every 256 values while
    building: a dict or set whose keys all hash alike costs quadratic time to build."""
    import time

    clock, left = clock or time.monotonic, MAX_ELEMENTS

    def build(data, depth):
        nonlocal left
        if depth > MAX_DEPTH:
            raise ValueError("answer nested too deep")
        left -= 1
        if left < 0:
            raise ValueError("answer has too many values")
        if deadline is not None and left % 256 == 0 and clock() > deadline:
            raise TimeoutError("time limit while decoding the answer")
        if isinstance(data, list):
            return [build(v, depth + 1) for v in data]
        if isinstance(data, dict):
            tag, items = data["__t"], data["v"]
            if tag == "float":
                return float(items)
            if tag == "dict":
                return {build(k, depth + 1): build(v, depth + 1) for k, v in items}
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](build(v, depth + 1) for v in items)
        return data

    return build(data, 0)


CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_libc = ctypes.CDLL(None, use_errno=True)


def _call(what: str, rc: int) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target: str, fstype, flags: int, data=None) -> None:
    source, fstype, data = (None if s is None else s.encode() for s in (source, fstype, data))
    _call(f"mount {target}", _libc.mount(source, target.encode(), fstype, ctypes.c_ulong(flags), data))


def _bind_read_only(source: str, target: str, nodev: int = MS_NODEV) -> None:
    if os.path.islink(source):  # /bin -> usr/bin on merged-/usr systems: the same link in the new root
        os.symlink(os.readlink(source), target)
        return
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    # a remount must keep the flags the source mount already has (a user namespace may not clear them)
    kept = os.statvfs(source).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | nodev | kept)


def enter_namespaces(root: str, keep: list, uid: int, hide: list = ()) -> None:
    """New namespaces; the new root `root` (an empty folder) holds `keep` read-only (with an empty folder over each
    path of `hide`) and a private /tmp. The program then runs without any capability over these mounts: as root, as
    an unprivileged uid of its own; otherwise in a nested user namespace as a non-zero uid."""
    outer_uid, outer_gid, as_root = os.getuid(), os.getgid(), os.getuid() == 0
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | (0 if as_root else CLONE_NEWUSER)
    _call("unshare", _libc.unshare(flags))
    if not as_root:
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {outer_uid} 1"), ("gid_map", f"0 {outer_gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    # the first child is PID 1 of the new PID namespace: when it ends, the kernel ends every process it left
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    _libc.prctl(1, 9)  # PR_SET_PDEATHSIG = SIGKILL: ends with the process the parent kills
    # the nested user namespace's maps are written after the pivot, where there is no /proc: the host's /proc is held
    # open until then (a lazily detached mount stays usable through an open descriptor), and closed right after
    proc = None if as_root else os.open("/proc", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    # the private /tmp before the kept paths: an interpreter under /tmp (a virtualenv on a node's local disk) is then
    # bound inside it, not hidden by it
    os.makedirs(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={FILE_BYTES},mode=1777")
    for path in keep:
        if os.path.lexists(path):
            _bind_read_only(path, root + path)
    for path in hide:  # installed packages (benchmark data among them) out of sight
        if os.path.isdir(root + path):
            _mount("tmpfs", root + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555")
    for device in ("null", "zero", "urandom", "random"):
        _bind_read_only(f"/dev/{device}", f"{root}/dev/{device}", nodev=0)
    os.chdir(root)
    _call("pivot_root", _libc.syscall(SYS_PIVOT_ROOT[os.uname().machine], b".", b"."))
    _call("umount", _libc.umount2(b".", MNT_DETACH))  # the old root is gone from this mount namespace
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir("/tmp")
    if as_root:
        drop_root(uid)
    else:
        # the mounts above belong to the user namespace this process created, where it holds every capability: a
        # nested one, entered as uid 1000, holds none over them (a remount or unmount fails)
        try:
            _call("unshare", _libc.unshare(CLONE_NEWUSER))
            for name, text in (("setgroups", b"deny"), ("uid_map", b"1000 0 1"), ("gid_map", b"1000 0 1")):
                fd = os.open(f"self/{name}", os.O_WRONLY | os.O_CLOEXEC, dir_fd=proc)
                try:
                    os.write(fd, text)
                finally:
                    os.close(fd)
        finally:
            os.close(proc)
        os.setresgid(1000, 1000, 1000)
        os.setresuid(1000, 1000, 1000)
    _libc.prctl(1, 9)  # PR_SET_PDEATHSIG again: changing uid cleared it


# Calls that fail with EPERM once the runner's set-up is done, at every level, as container runtimes deny them.
DENIED_SYSCALLS = (
    "keyctl", "add_key", "request_key",  # the kernel's keyrings: shared by every process of a uid, in no namespace
    # another process's memory, descriptors or signals (the trainer's, where the program shares its uid)
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "kcmp",
    "sync", "syncfs",  # the whole machine's writeback: a SIGKILL waits for it, past the reward's deadline
    "perf_event_open", "userfaultfd", "bpf", "io_uring_setup", "io_uring_enter", "io_uring_register",  # kernel surface
    # mounts, once the sandbox's own are made (the newer mount calls too)
    "mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree",
    "mount_setattr",
    # memory no address-space limit counts, which a System V segment keeps after the program ends
    "memfd_create", "shmget",
)
CLONE_THREAD = 0x00010000
# The limits level shares the host's network, processes and files: what its in-process guard refuses, refused here
# too, where `importlib.reload` or ctypes cannot undo it. A rule is a name, or (name, errno, (argument, mask, value)
# ...): denied where every argument masked equals its value.
LIMITS_DENIED = (
    "socket",  # no network (the host's loopback is reachable from the host's network namespace)
    "execve", "execveat", "fork", "vfork",  # no new program or process
    ("clone", errno.EPERM, ((0, CLONE_THREAD, 0),)),  # a thread only
    ("clone3", errno.ENOSYS, ()),  # its flags are in memory a filter cannot read: glibc then falls back to clone
)
# Where Landlock is not had: no file opened for writing and no name made or removed, anywhere (the runner's own
# files are opened before the filter). Each flag a rule of its own: a rule's conditions must all hold.
_WRITE_FLAGS = (os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC)
NO_WRITES = (
    *(("open", errno.EPERM, ((1, f, f),)) for f in _WRITE_FLAGS),
    *(("openat", errno.EPERM, ((2, f, f),)) for f in _WRITE_FLAGS),
    ("openat2", errno.ENOSYS, ()),  # its flags are in memory; glibc's open falls back to openat
    "creat", "truncate", "mkdir", "mkdirat", "mknod", "mknodat", "link", "linkat", "symlink", "symlinkat", "rename",
    "renameat", "renameat2", "unlink", "unlinkat", "rmdir",
)
SCMP_ACT_ALLOW, SCMP_ACT_ERRNO, SCMP_CMP_MASKED_EQ = 0x7FFF0000, 0x00050000, 7


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def load_libseccomp():
    """libseccomp's C library (bound here with ctypes: the runner imports the standard library only), opened before
    the sandbox hides the loader's cache in /etc; None where it is not installed."""
    try:
        lib = ctypes.CDLL("libseccomp.so.2")
    except OSError:
        return None
    lib.seccomp_init.restype, lib.seccomp_init.argtypes = ctypes.c_void_p, [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.restype, lib.seccomp_release.argtypes = None, [ctypes.c_void_p]
    return lib


def deny_syscalls(lib, rules=DENIED_SYSCALLS) -> str:
    """From here on each of `rules` (a name: EPERM; or as LIMITS_DENIED) fails in this process and every process it
    starts (a seccomp filter, which also sets no-new-privileges). Says what it did: "on", "on, without <names it could
    not resolve>", or "off: <why>"."""
    if lib is None:
        return "off: libseccomp.so.2 not found"
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        return "off: seccomp_init failed"
    unknown = []
    try:
        for rule in rules:
            name, err, conditions = (rule, errno.EPERM, ()) if isinstance(rule, str) else rule
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:  # a call newer than this libseccomp, or not on this architecture
                if name not in unknown:
                    unknown.append(name)
                continue
            args = (_ArgCmp * max(1, len(conditions)))(
                *(_ArgCmp(a, SCMP_CMP_MASKED_EQ, m, v) for a, m, v in conditions))
            rc = lib.seccomp_rule_add_array(ctx, SCMP_ACT_ERRNO | err, number, len(conditions), args)
            if rc < 0:
                return f"off: seccomp_rule_add({name}): {os.strerror(-rc)}"
        rc = lib.seccomp_load(ctx)
        if rc < 0:
            return f"off: seccomp_load: {os.strerror(-rc)}"
    finally:
        lib.seccomp_release(ctx)
    return "on" if not unknown else f"on, without {', '.join(unknown)}"


# Landlock (Linux 5.13+, no privilege needed): the access rights that change the file system, by ABI version
_LANDLOCK_WRITES = (1 << 1) | sum(1 << b for b in range(4, 13))  # write a file; remove or make any kind of name
_LANDLOCK_FILE_WRITES = (1 << 1) | (1 << 14)  # the rights a rule on a single file may hold: write, truncate


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_writes(folder: str) -> int:
    """From here on this process and every process it starts may change the file system only under `folder` (and
    write /dev/null): Landlock, enforced by the kernel. From ABI 4 TCP bind and connect are refused too, from ABI 6
    signals to processes outside (the trainer's, where the program shares its uid). The ABI had, or 0 where the
    kernel (or a container's syscall filter) offers none."""
    syscall = _libc.syscall
    syscall.restype = ctypes.c_long
    abi = syscall(ctypes.c_long(444), None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # the ABI version
    if abi < 1:
        return 0
    handled = _LANDLOCK_WRITES | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)  # refer, truncate
    attr = (ctypes.c_uint64 * 3)(handled, 0b11 if abi >= 4 else 0, 0b11 if abi >= 6 else 0)
    ruleset = syscall(ctypes.c_long(444), attr, ctypes.c_size_t(8 if abi < 4 else 16 if abi < 6 else 24),
                      ctypes.c_uint32(0))
    if ruleset < 0:
        return 0
    try:
        for path, access in ((folder, handled), (os.devnull, handled & _LANDLOCK_FILE_WRITES)):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(access, fd)
                _call(f"landlock_add_rule {path}", syscall(ctypes.c_long(445), ctypes.c_int(ruleset),
                                                           ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0)))
            finally:
                os.close(fd)
        _call("prctl(PR_SET_NO_NEW_PRIVS)", _libc.prctl(38, 1, 0, 0, 0))  # what an unprivileged process needs first
        _call("landlock_restrict_self", syscall(ctypes.c_long(446), ctypes.c_int(ruleset), ctypes.c_uint32(0)))
    except OSError:  # not enforced: the caller falls back to the syscall filter's NO_WRITES
        return 0
    finally:
        os.close(ruleset)
    return abi


def drop_root(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def guard(workdir: str) -> None:
    """The in-process guard of the "limits" level, as HumanEval's harness has: no new processes, sockets, deletions or
    writes elsewhere through `os`, `posix`, `shutil`, `subprocess` and `socket`. A program can undo it (ctypes,
    `importlib.reload`): what holds is the kernel's (`landlock_writes`, LIMITS_DENIED, NO_WRITES); this only makes
    the refusal an ordinary Python error."""
    import builtins
    import posix
    import shutil
    import socket
    import subprocess

    def refused(*args, **kwargs):
        raise PermissionError("disabled by the code reward's guard")

    both = ("fork", "forkpty", "system", "kill", "killpg", "remove", "unlink", "rmdir", "rename", "replace", "truncate",
            "chmod", "chown", "putenv", "execv", "execve", "posix_spawn", "posix_spawnp", "setuid")
    for module, names in ((os, both + ("popen", "removedirs", "renames", "execvp", "execl", "spawnv", "spawnl")),
                          (posix, both + ("setsid",)), (shutil, ("rmtree", "move", "chown")),
                          (subprocess, ("Popen", "run", "call", "check_output")),
                          (socket, ("socket", "create_connection", "socketpair"))):
        for name in names:
            if hasattr(module, name):
                setattr(module, name, refused)
    real_open, root = builtins.open, os.path.realpath(workdir)

    def open_here(file, mode="r", *args, **kwargs):
        writes = any(c in mode for c in "wax+")
        if writes and not isinstance(file, int) and not os.path.realpath(file).startswith(root + os.sep):
            raise PermissionError(f"{file}: writes outside the working folder are disabled")
        return real_open(file, mode, *args, **kwargs)

    builtins.open = io.open = open_here


def set_limits(memory_mb: int, cpu_s: int, processes: int) -> None:
    """RLIMIT_NPROC counts the tasks (processes and threads) of this uid, in its user namespace: `processes` 1 leaves
    room for none besides this one."""
    for which, value in ((resource.RLIMIT_AS, int(memory_mb) * 1024 * 1024), (resource.RLIMIT_CPU, int(cpu_s)),
                         (resource.RLIMIT_FSIZE, FILE_BYTES), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_NPROC, int(processes))):
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass


SHARED_UID = ("the limits level without root runs the program under the trainer's own uid, where it can read the "
              "trainer's memory (/proc/<pid>/mem) and environment and send it signals: allow user namespaces, run as "
              "root, or accept this with code_allow_shared_uid=true in reward_kwargs (compute_score(..., "
              "allow_shared_uid=True), or DARL_REWARD_ALLOW_SHARED_UID=1)")


def isolate(sandbox: dict) -> tuple:
    """The level this process reached, "namespaces" when asked and the kernel allows it, else "limits"; and why the
    namespaces were not had where they were asked (announced by the parent), else None. The limits level without
    root raises unless the header accepts a program that shares the trainer's uid ("shared_uid")."""
    level, why = sandbox.get("level", "limits"), None
    if level == "namespaces":
        try:
            enter_namespaces(sandbox["root"], sandbox["keep"], sandbox["uid"], sandbox.get("hide", ()))
            return level, None
        except OSError as e:
            if sandbox.get("required"):
                raise
            level, why = "limits", str(e)  # the fallback
    os.chdir(sandbox["root"])
    if os.getuid() == 0:
        closed = [p for p in (sys.prefix, sys.base_prefix) if not _world_traversable(p)]
        if closed:
            raise OSError(f"the limits level does not run programs as root, and an unprivileged uid cannot read "
                          f"the interpreter under {closed[0]} (a folder on its path is closed to other users): make "
                          f"its folders readable by others (chmod o+rx) or allow namespaces")
        drop_root(sandbox["uid"])  # (the parent made the working folder this uid's)
        _libc.prctl(1, 9)  # PR_SET_PDEATHSIG: ends with the process the parent kills
    elif not sandbox.get("shared_uid"):
        raise OSError(SHARED_UID + (f" (namespaces: {why})" if why else ""))
    return level, why


def _world_traversable(path: str) -> bool:
    """Another uid can still import from `path` (no folder on the way closed to others)."""
    path = os.path.realpath(path)
    while True:
        if not os.stat(path).st_mode & 0o001:
            return False
        if path == "/":
            return True
        path = os.path.dirname(path)


def open_streams() -> tuple[int, int]:
    """The files a script's stdin and stdout pass through, opened in the working folder before the syscall filter (which
    may refuse opening files for writing) and kept for every request."""
    flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    return tuple(os.open(name, flags, 0o600) for name in ("stdin", "stdout"))


def run_script(program, text: str, streams: tuple[int, int]) -> dict:
    """`program` as __main__ with `text` on descriptor 0 and descriptor 1 captured (through `streams`)."""
    given, taken = streams
    os.ftruncate(given, 0)
    os.pwrite(given, text.encode("utf-8"), 0)
    os.ftruncate(taken, 0)
    # (a previous test's program may have closed descriptor 0 or 1, `open(0).read()` does: dup2 gives it back)
    for fd, target in ((given, 0), (taken, 1)):
        os.lseek(fd, 0, os.SEEK_SET)
        os.dup2(fd, target)
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)
    code = 0
    try:
        exec(program, {"__name__": "__main__"})
    except SystemExit as e:
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    except BaseException as e:  # noqa: BLE001 - the program's own error is its answer
        code = type(e).__name__
    finally:
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001
            pass
    written = os.pread(taken, os.fstat(taken).st_size, 0)
    return {"stdout": written.decode("utf-8", errors="replace"), "exit": code}


def main() -> int:
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb")
    header = json.loads(requests.readline())
    libseccomp = load_libseccomp()

    def answer(message: dict) -> None:
        answers.write(json.dumps(message).encode() + b"\n")
        answers.flush()

    try:
        level, why = isolate(header["sandbox"])
    except OSError as e:
        answer({"error": f"isolation: {e}"})
        return 1
    set_limits(header["memory_mb"], header["cpu_s"], header["processes"])
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    sys.stdout = sys.stderr = open(os.devnull, "w")
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    streams = open_streams()
    walls = {}
    if level == "namespaces":
        syscall_filter = deny_syscalls(libseccomp)  # last: the set-up above mounts, nothing after needs these calls
    else:  # the host's files, network and processes, refused by the kernel: what the guard does, where it holds
        guard(os.getcwd())
        landlock = landlock_writes(os.getcwd())
        syscall_filter = deny_syscalls(libseccomp, DENIED_SYSCALLS + LIMITS_DENIED + (() if landlock else NO_WRITES))
        walls["writes"] = (f"refused by landlock (ABI {landlock})" if landlock else "refused by the syscall filter"
                           if syscall_filter.startswith("on") else "refused by the in-process guard only")
    # ready before any of the program's code runs (compiling runs none): the first line the parent reads is the
    # runner's own, whatever the program writes later on any descriptor
    answer({"ready": level, "filter": syscall_filter, **walls, **({} if why is None else {"why": why})})
    kind, name = header["kind"], header.get("name")
    try:
        program = compile(PRELUDE + header["code"], "<solution>", "exec")
        if kind == "call":
            namespace = {"__name__": "__solution__"}
            exec(program, namespace)
            fn = getattr(namespace["Solution"](), name) if "Solution" in namespace else namespace[name]
    except BaseException as e:  # noqa: BLE001
        answer({"error": type(e).__name__})
        return 1
    answer({"loaded": True})
    for line in requests:
        request = json.loads(line)
        if kind == "stdin":
            answer(run_script(program, request["stdin"], streams))
            continue
        try:
            value = fn(*decode(request["args"]))
            answer({"value": encode(value)})
        except BaseException as e:  # noqa: BLE001
            answer({"error": type(e).__name__})
    return 0


if __name__ == "__main__":
    sys.exit(main())
