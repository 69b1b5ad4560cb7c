"""OS-level isolation of an evaluation worker (Linux; INTEGRITY.md rows 10, 12 and 13). Standard library only.

Two halves. The orchestrator starts each worker behind `launcher_argv()` (after `worker_launch`
has picked the worker's user id and handed it its directories); the worker calls `enter()` as the
very first thing in its main(), before any CUDA context and any candidate code. Together:

- namespaces: the launcher (this file run as a script) unshares mount, PID, network, IPC and UTS
  namespaces and forks a minimal init, PID 1 of the new PID namespace, which mounts a /proc of that
  namespace and starts the worker as its only child. When the worker exits the init exits at once,
  and the kernel kills everything left in the namespace: a `setsid`, double-forked grandchild too.
  The worker is not PID 1 itself: the kernel drops signals with default action sent to a namespace's
  init from inside it, so RLIMIT_CPU's SIGXCPU and a candidate's own `os.kill(os.getpid(), SIGSEGV)`
  would not end it (measured with `unshare --pid --fork`: the self-sent SIGSEGV was ignored, and the
  CPU limit ended as SIGKILL at the hard limit, which util-linux 2.38 then reported as exit code 1).
  The launcher, outside the namespace, ends the way the worker ended (the same signal, or the same
  exit code), so the orchestrator reads the worker's status as before. Each of the three processes
  dies with its parent (the launcher with the orchestrator's thread that started it).
- `enter()`, still root inside the namespaces: all mounts private; fresh tmpfs on /tmp, /var/tmp,
  /run/lock and /dev/shm, with the worker's own directories (its control and working directories)
  and the kernel caches bound back at the same paths; the project root read-only except the caches;
  loopback up in the empty network namespace; then the worker's own user id (one per worker, never
  0, chosen by the orchestrator), no new privileges, not dumpable (nothing can ptrace it or read
  its memory through /proc). Directories that user could not even traverse (a 0700 /root holding
  the interpreter) are hidden behind a tmpfs too, with what the worker needs of them bound back.
- caches: the kernel cache and the harness's build directories in it (cpu/, cuda/, nvrtc/) are
  1777: each worker adds artifacts it alone owns. The tool caches (inductor, Triton, torch
  extensions) are shared through one group, SANDBOX_GID, since those tools lock and rewrite files
  in directories another worker made; what one worker writes there, the next can change.

Each layer that cannot be had is recorded as "refused: <why>" and the worker goes on: enter() never
raises. KFORGE_SANDBOX=off turns everything off (the tests use it to show each probe would succeed
without the sandbox).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

LAYERS = ("mount", "pid", "network", "ipc", "uts", "user", "tmp", "shm", "project_readonly", "no_ptrace")
NAMESPACES = ("mnt", "pid", "net", "ipc", "uts")
TMP_DIRS = ("/tmp", "/var/tmp", "/run/lock")  # the world-writable directories of a Linux host
SHM_DIR = "/dev/shm"
CACHE_VARIABLES = ("KFORGE_KERNEL_CACHE", "TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
# Subdirectories of the kernel cache that tasks/harness/cpu.py, cuda.py and nvrtc.py build into.
KERNEL_CACHE_SUBDIRS = ("cpu", "cuda", "nvrtc")
UID_BASE, UID_SPAN = 200_000, 50_000
# The one group every sandboxed worker is in besides its own: the tool caches (inductor, Triton, torch
# extensions) are shared through it. Those tools lock and rewrite files inside directories another
# worker made (inductor's locks/*.lock: a second user got EACCES and torch.compile failed), which no
# owner-only scheme allows; the harness's own artifacts (cpu/, cuda/, nvrtc/) stay owner-only.
SANDBOX_GID = UID_BASE + UID_SPAN
SANDBOX_USER = "kforge-worker"  # USER and LOGNAME of a worker with a uid of its own
TOOL_CACHE_MODE, ARTIFACT_MODE = 0o3775, 0o1777  # setgid + sticky, group-writable; sticky, world-writable
# Between the orchestrator and the worker (popped by the worker before any candidate code runs).
ENV_UID, ENV_DIRS, ENV_HOST_NS, ENV_LAUNCH = (
    "KFORGE_SANDBOX_UID",
    "KFORGE_SANDBOX_DIRS",
    "KFORGE_SANDBOX_HOST_NS",
    "KFORGE_SANDBOX_LAUNCH",
)

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_GET_NO_NEW_PRIVS = 1, 3, 4, 38, 39
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
# NOROOT, NO_SETUID_FIXUP, KEEP_CAPS and NO_CAP_AMBIENT_RAISE, each locked: uid 0 regains nothing on exec
SECUREBITS_ALL_LOCKED = 0b11101111
CAPABILITY_VERSION_3 = 0x20080522
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
# statvfs flags -> the mount flags a read-only remount must keep (the kernel refuses to clear locked ones)
KEPT_FLAGS = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_NOATIME, MS_NOATIME),
    (os.ST_NODIRATIME, MS_NODIRATIME),
    (os.ST_RELATIME, MS_RELATIME),
)


def disabled() -> bool:
    return os.environ.get("KFORGE_SANDBOX", "").strip().lower() in ("off", "0", "no", "false")


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.unshare.argtypes = [ctypes.c_int]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc


def _check(status: int, what: str) -> None:
    if status != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: None if text is None else os.fsencode(text)  # noqa: E731
    status = _libc().mount(encode(source), encode(target), encode(fstype), flags, encode(data))
    _check(status, f"mount {target}")


def _umount(target: str) -> None:
    _libc().umount2(os.fsencode(target), MNT_DETACH)


def _prctl(option: int, value: int) -> None:
    _check(_libc().prctl(option, value, 0, 0, 0), f"prctl {option}")


def _refused(exc: BaseException) -> str:
    return f"refused: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}"


def _ns_inode(name: str) -> int | None:
    try:
        return os.stat(f"/proc/self/ns/{name}").st_ino
    except OSError:
        return None


# --- the orchestrator's side ------------------------------------------------------------------------


def _script() -> list[str]:
    """This file run by the interpreter in isolated mode, without site (the launcher imports nothing else)."""
    return [sys.executable, "-I", "-S", str(Path(__file__).resolve())]


@functools.cache
def _launch_mode() -> str | None:
    """'root' or 'user' (an unprivileged user namespace) where the launcher's unshare works here,
    else None; probed once per process by running the launcher's own check."""
    if not sys.platform.startswith("linux"):
        return None
    mode = "root" if os.geteuid() == 0 else "user"
    probe = [*_script(), "--probe", *(["--user"] if mode == "user" else [])]
    try:
        done = subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return mode if done.returncode == 0 else None


def launcher_argv() -> list[str]:
    """The command prefix that starts a worker in its own namespaces (see the module docstring);
    [] where namespaces cannot be had (the worker's layers then read refused) or KFORGE_SANDBOX=off."""
    mode = None if disabled() else _launch_mode()
    if mode is None:
        return []
    return [*_script(), *(["--user"] if mode == "user" else []), "--"]


_uid_counter = itertools.count(int.from_bytes(os.urandom(4), "little") % UID_SPAN)
_uid_lock = threading.Lock()
# One lock file per user id in use, on the host (not in any worker's private /tmp): a second kforge
# process on the host (a nightly run beside a developer's `kforge eval`) skips the ids this one holds
UID_LOCKS = Path("/dev/shm" if Path("/dev/shm").is_dir() else "/tmp") / "kforge-uids"
_held_uids: dict[int, Any] = {}  # user id -> its locked file, while its worker lives


def next_uid() -> int:
    """A user id of its own for the next worker: 200000 + a counter modulo 50000 (never 0), none
    that a live worker of this or another kforge process on the host holds. Held until `release_uid`."""
    import fcntl

    with _uid_lock:
        for _ in range(UID_SPAN):
            uid = UID_BASE + next(_uid_counter) % UID_SPAN
            if uid in _held_uids:
                continue
            path = UID_LOCKS / str(uid)
            try:
                UID_LOCKS.mkdir(mode=0o700, parents=True, exist_ok=True)
                held = open(path, "w")  # noqa: SIM115 - kept open while the worker lives
            except OSError:  # no place for the locks (a read-only /dev/shm): the random start alone
                return uid
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                # the file is removed on release: one locked after its holder removed it is not the id's
                if os.fstat(held.fileno()).st_ino != path.stat().st_ino:
                    raise OSError("released meanwhile")
            except OSError:
                held.close()
                continue
            _held_uids[uid] = held
            return uid
    raise RuntimeError(f"every worker user id ({UID_BASE}-{UID_BASE + UID_SPAN - 1}) is in use on this host")


def release_uid(uid: int) -> None:
    """The user id of a worker that has ended (and everything it started) is free again."""
    with _uid_lock:
        held = _held_uids.pop(uid, None)
    if held is not None:
        with contextlib.suppress(OSError):
            (UID_LOCKS / str(uid)).unlink()  # before the lock goes: no one else holds the id meanwhile
        held.close()


def _shared_caches(env: dict[str, str]) -> list[tuple[Path, bool]]:
    """(directory, is a tool cache) for the kernel cache, the subdirectories the harness builds into,
    and the tool caches inside it (TORCH_EXTENSIONS_DIR, TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR)."""
    kernel_cache = env.get("KFORGE_KERNEL_CACHE")
    if not kernel_cache:
        return []
    root = Path(kernel_cache)
    caches = [(root, False), *((root / name, False) for name in KERNEL_CACHE_SUBDIRS)]
    for variable in CACHE_VARIABLES[1:]:
        if (path := env.get(variable)) and Path(path).is_relative_to(root):
            caches.append((Path(path), True))
    return caches


def _share_tool_cache(directory: Path) -> None:
    """Group SANDBOX_GID and mode 3775 on `directory`; the first time, also group write on all it holds
    (a cache filled before by workers that ran as root)."""
    if directory.stat().st_gid == SANDBOX_GID and stat.S_IMODE(directory.stat().st_mode) == TOOL_CACHE_MODE:
        return
    for parent, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(parent, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                continue
            os.chown(path, -1, SANDBOX_GID)
            extra = stat.S_ISGID | stat.S_IRWXG if stat.S_ISDIR(info.st_mode) else stat.S_IRGRP | stat.S_IWGRP
            os.chmod(path, stat.S_IMODE(info.st_mode) | extra)
    os.chown(directory, -1, SANDBOX_GID)
    os.chmod(directory, TOOL_CACHE_MODE)


def worker_launch(own_dirs: list[Path], home: Path, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """For the orchestrator, per worker: (command prefix, environment additions). Where the prefix
    gives namespaces and this process is root, the worker gets a user id of its own: `own_dirs`
    (which it must read and write) are chowned to it, HOME becomes `home`, the kernel cache and the
    harness's build directories get mode 1777 (every worker adds artifacts, none replaces another's)
    and the tool caches inside it are shared through SANDBOX_GID."""
    extra = {ENV_DIRS: os.pathsep.join(str(d) for d in own_dirs)}
    if disabled():
        return [], {**extra, "KFORGE_SANDBOX": "off"}
    prefix = launcher_argv()
    if prefix:
        extra["TMPDIR"] = "/tmp"  # the worker's private tmpfs (compilers write their temporaries there)
    if not prefix or os.geteuid() != 0:
        return prefix, extra
    uid = next_uid()
    for directory in own_dirs:
        os.chown(directory, uid, uid)
    for cache, is_tool_cache in _shared_caches(env):
        cache.mkdir(parents=True, exist_ok=True)
        if is_tool_cache:
            _share_tool_cache(cache)
        elif stat.S_IMODE(cache.stat().st_mode) != ARTIFACT_MODE:
            os.chmod(cache, ARTIFACT_MODE)
    # The uid has no passwd entry: getpass.getuser() (inductor's and Triton's cache paths) reads these first.
    names = {"USER": SANDBOX_USER, "LOGNAME": SANDBOX_USER}
    return prefix, {**extra, ENV_UID: str(uid), "HOME": str(home), **names}


# --- the launcher and the namespace's init (this file run as a script, as root or in a user namespace) ---


def _end_like(status: int) -> None:
    """Exit the way a child with wait status `status` ended: killed by the same signal, or with its code."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
        os.kill(os.getpid(), number)
        os._exit(128 + number)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _init(command: list[str], report_fd: int) -> None:
    """PID 1 of the new namespace: mount its /proc, run `command` as the only child, reap orphans
    until that child ends, report its wait status on `report_fd` and exit (which ends the namespace)."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as exc:
        os.environ[ENV_LAUNCH] = f"refused: {exc.strerror}"
    worker = os.fork()
    if worker == 0:
        try:
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == worker:
            os.write(report_fd, str(status).encode())
            os._exit(0)


def _launch(user: bool, command: list[str]) -> None:
    """Unshare the namespaces, fork the init, wait for it and end the way the worker ended. Where
    unshare is refused, run `command` as it is (its enter() then records every layer as refused)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    host = {name: _ns_inode(name) for name in NAMESPACES}
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | (CLONE_NEWUSER if user else 0)
    try:
        _check(_libc().unshare(flags), "unshare")
        if user:
            for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
                with open(f"/proc/self/{name}", "w") as file:
                    file.write(text)
    except OSError as exc:
        os.environ[ENV_LAUNCH] = f"refused: {exc.strerror}"
        os.execvp(command[0], command)
    os.environ[ENV_HOST_NS] = ",".join(f"{name}:{inode}" for name, inode in host.items() if inode)
    read_fd, write_fd = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(read_fd)
        _init(command, write_fd)
    os.close(write_fd)
    report = b""
    while chunk := os.read(read_fd, 64):
        report += chunk
    _, status = os.waitpid(init, 0)
    _end_like(int(report) if report else status)


def _probe(user: bool) -> int:
    """0 where this process may unshare the launcher's namespaces."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | (CLONE_NEWUSER if user else 0)
    return 0 if _libc().unshare(flags) == 0 else 1


# --- the worker's side ------------------------------------------------------------------------------


def from_environment() -> dict:
    """enter()'s arguments as the orchestrator passed them (popped from the environment, so the
    candidate does not see them): own directories (the working directory always among them),
    the project root and the user id to become."""
    dirs = [Path(d) for d in os.environ.pop(ENV_DIRS, "").split(os.pathsep) if d]
    uid = os.environ.pop(ENV_UID, "")
    return {
        "own_dirs": [*dirs, Path.cwd()],
        "project_root": Path(__file__).resolve().parents[2],
        "uid": int(uid) if uid.isdigit() else None,
    }


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _top_level(paths: list[str]) -> list[str]:
    """`paths` without those inside another of them, shallowest first."""
    unique = sorted(set(paths), key=lambda p: (p.count("/"), p))
    return [p for i, p in enumerate(unique) if not any(_under(p, q) for q in unique[:i] if q != p)]


def _existing_dir(path: str | os.PathLike) -> str | None:
    real = os.path.realpath(path)
    if os.path.isfile(real):
        real = os.path.dirname(real)
    return real if os.path.isdir(real) else None


def _readable_paths(project_root: Path) -> list[str]:
    """What the worker reads after it drops privileges: the interpreter, its library path, the
    project, the CUDA toolkit and library folders named in its environment."""
    candidates = [sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, project_root]
    candidates += [p for p in sys.path if p]
    candidates += [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    candidates += [os.environ[v] for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    return [d for d in map(_existing_dir, candidates) if d]


def _writable_paths(own_dirs: list[Path]) -> list[str]:
    caches = [os.environ[v] for v in CACHE_VARIABLES if os.environ.get(v)]
    return [d for d in map(_existing_dir, [*own_dirs, *caches]) if d]


def _blocked_ancestors(paths: list[str]) -> list[str]:
    """The topmost directory above each of `paths` that a user of no group on it could not traverse
    (no o+x, like a 0700 /root holding the interpreter): these get a tmpfs with the paths bound back."""
    blocked = []
    for path in paths:
        parts = Path(path).parts
        for depth in range(2, len(parts)):
            ancestor = str(Path(*parts[:depth]))
            try:
                if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                    blocked.append(ancestor)
                    break
            except OSError:
                break
    return blocked


def _mount_flags(path: str) -> int:
    kept = os.statvfs(path).f_flag
    return sum(flag for st_flag, flag in KEPT_FLAGS if kept & st_flag)


def _mounts_at_or_below(root: str) -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = line.split()[4].encode().decode("unicode_escape")
            if _under(point, root) and point not in points:
                points.append(point)
    return points


def _mask(directory: str, mode: str, exposed: list[str], fds: dict[str, int]) -> None:
    """A fresh tmpfs on `directory`, then each of `exposed` (inside it) bound back from its fd; where
    a bind fails, the tmpfs goes again, so the worker never loses its own directories."""
    _mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode}")
    try:
        for path in _top_level([p for p in exposed if _under(p, directory) and p != directory]):
            os.makedirs(path, mode=0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fds[path]}", path, None, MS_BIND | MS_REC)
    except OSError:
        _umount(directory)
        raise


def _filesystem(own_dirs, project_root: str, uid: int | None) -> dict[str, str]:
    """The tmp, shm and project_readonly layers, plus a tmpfs over each directory the worker's user
    could not traverse (a failure there comes back under "hidden"; the privilege drop then refuses)."""
    layers: dict[str, str] = {}
    readable, writable = _readable_paths(Path(project_root)), _writable_paths(own_dirs)
    masks = [(d, "tmp", "1777") for d in TMP_DIRS if os.path.realpath(d) == d and os.path.isdir(d)]
    masks.append((SHM_DIR, "shm", "1777"))
    if uid is not None:
        masks += [(d, "hidden", "755") for d in _blocked_ancestors([*readable, *writable])]
    masks = [m for m in masks if not any(_under(m[0], other[0]) and m[0] != other[0] for other in masks)]
    exposed = [p for p in [*readable, *writable] if any(_under(p, m[0]) for m in masks)]
    fds: dict[str, int] = {}
    cwd = os.getcwd()
    old_umask = os.umask(0o022)
    try:
        for path in {*exposed, *writable, project_root}:
            fds[path] = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        for directory, layer, mode in sorted(masks, key=lambda m: m[0].count("/")):
            try:
                _mask(directory, mode, exposed, fds)
                layers.setdefault(layer, "ok")
            except OSError as exc:
                layers[layer] = f"refused: {directory}: {exc.strerror}"
        layers["project_readonly"] = _project_readonly(project_root, writable, fds)
        os.chdir(cwd)  # through the mounts just made
    except OSError as exc:
        layers = {layer: layers.get(layer, _refused(exc)) for layer in ("tmp", "shm", "project_readonly")}
    finally:
        os.umask(old_umask)
        for fd in fds.values():
            os.close(fd)
    return layers


def _project_readonly(root: str, writable: list[str], fds: dict[str, int]) -> str:
    """Bind the project onto itself read-only (every mount below it too), then bind the writable
    directories inside it (a kernel cache) back from fds opened before."""
    try:
        _mount(root, root, None, MS_BIND | MS_REC)
    except OSError as exc:
        return _refused(exc)
    try:
        for point in _mounts_at_or_below(root):
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _mount_flags(point))
        for path in _top_level([p for p in writable if _under(p, root)]):
            _mount(f"/proc/self/fd/{fds[path]}", path, None, MS_BIND | MS_REC)
    except OSError as exc:
        _umount(root)  # the bind made above, with whatever it got: the project as it was
        return _refused(exc)
    return "ok" if os.statvfs(root).f_flag & os.ST_RDONLY else "refused: the remount did not take"


def _loopback_up() -> str | None:
    """Bring up `lo` in this (new, empty) network namespace: torch.compile's local workers talk
    over it. None when up, else why not."""
    import fcntl
    import socket
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            request = struct.pack("16sH22x", b"lo", 0)
            flags = struct.unpack("16sH22x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
            if not flags & IFF_UP:
                fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _network(new: bool, why_not: str) -> str:
    if not new:
        return why_not
    import socket

    others = [name for _, name in socket.if_nameindex() if name != "lo"]
    if others:
        return f"refused: interfaces {', '.join(others)} in the worker's network namespace"
    loopback = _loopback_up()
    return "ok" if loopback is None else f"ok (loopback down: {loopback})"


def _drop_privileges(uid: int | None, needs: list[tuple[str, int]]) -> str:
    """Become `uid` (gid the same number, SANDBOX_GID the one supplementary group, umask 002: what it
    makes in a tool cache stays writable for the next worker), first checking as that user (effective
    ids only, still revocable) that everything in `needs` stays usable."""
    if uid is None:
        return "refused: no user id of its own (the orchestrator is not root)"
    if uid == 0 or os.geteuid() != 0:
        return f"refused: cannot become uid {uid} (running as uid {os.geteuid()})"
    try:
        os.setgroups([SANDBOX_GID])
        os.setresgid(-1, uid, -1)
        os.setresuid(-1, uid, -1)
        unusable = [path for path, mode in needs if not os.access(path, mode, effective_ids=True)]
    except OSError as exc:
        unusable, failure = [], _refused(exc)
    else:
        failure = f"refused: uid {uid} could not use {unusable[0]}" if unusable else None
    if failure:
        os.setresuid(-1, 0, -1)  # back to root (the real and saved ids still are)
        os.setresgid(-1, 0, -1)
        return failure
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    os.umask(0o002)  # group write matters only in the tool caches: elsewhere the group is the worker's own
    return "ok" if os.getresuid() == (uid, uid, uid) and os.getresgid() == (uid, uid, uid) else "refused: ids unchanged"


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities() -> str:
    """Where the worker stays uid 0 (in its user namespace, or where the drop was refused): no
    capabilities, now or after any exec, so the candidate cannot undo the mounts made above."""
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        for capability in range(last + 1):
            _prctl(PR_CAPBSET_DROP, capability)
        _check(_libc().prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl ambient")
        _prctl(PR_SET_SECUREBITS, SECUREBITS_ALL_LOCKED)
        header, data = _CapHeader(CAPABILITY_VERSION_3, 0), (_CapData * 2)()
        _check(_libc().capset(ctypes.byref(header), data), "capset")
    except (OSError, ValueError) as exc:
        return f"capabilities kept: {_refused(exc)}"
    return "all capabilities dropped"


def _no_ptrace() -> str:
    try:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        _prctl(PR_SET_DUMPABLE, 0)
    except OSError as exc:
        return _refused(exc)
    dumpable, no_new_privs = (_libc().prctl(option, 0, 0, 0, 0) for option in (PR_GET_DUMPABLE, PR_GET_NO_NEW_PRIVS))
    return "ok" if dumpable == 0 and no_new_privs == 1 else f"refused: dumpable {dumpable}, no_new_privs {no_new_privs}"


def _own_proc() -> bool:
    """Whether /proc is the one of this process's PID namespace (the init mounted it)."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def _private_mounts() -> str:
    """Nothing mounted from here on propagates to the orchestrator's mount namespace."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    return "ok"


def _safely(layer, *args) -> str:
    """`layer(*args)`, or "refused: ..." for whatever it raises: enter() never stops the worker."""
    try:
        return layer(*args)
    except Exception as exc:  # noqa: BLE001 - a layer that cannot be had is recorded, never fatal
        return _refused(exc)


def enter(own_dirs: list[Path], project_root: Path, uid: int | None) -> dict[str, str]:
    """Isolate this worker process (see the module docstring); returns "ok" or "refused: <why>"
    for each of LAYERS. Call it first of all in the worker, as root inside the launcher's namespaces."""
    if disabled():
        return {layer: "refused: disabled (KFORGE_SANDBOX=off)" for layer in LAYERS}
    launch = os.environ.pop(ENV_LAUNCH, None)
    host_ns = dict(item.split(":", 1) for item in os.environ.pop(ENV_HOST_NS, "").split(",") if ":" in item)
    why_not = launch or "refused: not started by the sandbox launcher"
    new = {name: name in host_ns and str(_ns_inode(name)) != host_ns[name] for name in NAMESPACES}
    layers = {layer: "refused: no mount namespace of its own" for layer in LAYERS}
    layers["ipc"] = "ok" if new["ipc"] else why_not
    layers["uts"] = "ok" if new["uts"] else why_not
    layers["pid"] = "ok" if new["pid"] and _own_proc() else why_not
    layers["network"] = _safely(_network, new["net"], why_not)
    root = os.path.realpath(project_root)
    hidden = "ok"
    if new["mnt"]:
        layers["mount"] = _safely(_private_mounts)
        if layers["mount"] == "ok":
            try:
                layers.update(_filesystem(own_dirs, root, uid))
            except Exception as exc:  # noqa: BLE001
                layers.update({layer: _refused(exc) for layer in ("tmp", "shm", "project_readonly")})
            hidden = layers.pop("hidden", "ok")
    else:
        layers["mount"] = why_not

    def user_layer() -> str:
        needs = [(os.path.realpath(sys.executable), os.X_OK)]
        needs += [(p, os.R_OK | os.X_OK) for p in _readable_paths(Path(root))]
        needs += [(p, os.R_OK | os.W_OK | os.X_OK) for p in _writable_paths(own_dirs)]
        return _drop_privileges(uid, needs)

    user = _safely(user_layer)
    if user != "ok" and new["mnt"]:  # still uid 0: keep the candidate from undoing the mounts
        user = f"{user}; {_safely(_drop_capabilities)}"
    layers["user"] = user if hidden == "ok" else f"{user} ({hidden})"
    layers["no_ptrace"] = _safely(_no_ptrace)
    return layers


if __name__ == "__main__":
    #   sandbox.py [--user] -- COMMAND...   (launch)        sandbox.py --probe [--user]   (exit 0 where it can)
    arguments = sys.argv[1:]
    split = arguments.index("--") if "--" in arguments else len(arguments)
    options, command = arguments[:split], arguments[split + 1 :]
    if "--probe" in options:
        sys.exit(_probe("--user" in options))
    _launch("--user" in options, command)
