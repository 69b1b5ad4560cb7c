"""The OS-level sandbox of every evaluation worker (tasks/harness/sandbox.py; INTEGRITY.md rows 10, 12, 13),
each layer shown from inside a real worker started by tasks.isolate.run_worker.

A probe candidate tries every escape at module level (the compile mode imports it) and raises
RuntimeError("probe: {...}") with what it found; the test reads that from the error excerpt. Each probe
would succeed without the sandbox: `test_probes_escape_without_the_sandbox` runs the same candidate with
KFORGE_SANDBOX=off (no launcher, enter() refuses every layer) and asserts that every one of them gets out:
it sees the test's files in /tmp and /dev/shm, writes into the project, sees and signals the test process,
reads its memory through /proc/<pid>/mem and process_vm_readv, reaches its TCP listener, runs as root,
and leaves a `setsid` double-forked grandchild running after the worker is gone.

Namespaces, mounts and a user id per worker need root here (the orchestrator runs as root on the
evaluation hosts); run as another user, these tests are skipped with that reason.
"""

import ctypes
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tasks.harness import sandbox
from tasks.isolate import PROJECT_ROOT, Limits, run_worker

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not sandbox.launcher_argv(),
    reason="the sandbox's namespaces, mounts and per-worker user ids need root (run as another user here)",
)

PROBLEM = (PROJECT_ROOT / "data" / "problems" / "smoke" / "1_relu.py").read_text()
HONEST = (PROJECT_ROOT / "kernels_ref" / "cpu" / "1_relu.py").read_text()  # a g++ kernel through load_cpp
MARKER = "4242.5"  # the grandchild runs `sleep 4242.5`: pgrep finds it by that

PROBE = textwrap.dedent(
    """
    import ctypes, getpass, json, os, socket, time

    # getpass.getuser() raises where the uid has no name (inductor and Triton call it for their caches)
    found = {"uid": os.getuid(), "cwd": os.getcwd(), "user": getpass.getuser()}
    found["sees_tmp_file"] = os.path.exists(TMP_FILE)
    found["sees_shm_file"] = os.path.exists(SHM_FILE)
    try:
        with open(PROJECT_FILE, "w") as file:
            file.write("escaped")
        found["wrote_project"] = True
    except OSError as exc:
        found["wrote_project"] = False
        found["project_error"] = exc.strerror
    found["sees_test_pid"] = str(TEST_PID) in os.listdir("/proc")
    try:
        os.kill(TEST_PID, 0)
        found["signals_test"] = True
    except OSError as exc:
        found["signals_test"] = False
        found["signal_error"] = exc.strerror
    try:
        with open(f"/proc/{TEST_PID}/mem", "rb") as mem:
            mem.seek(SECRET_ADDRESS)
            found["proc_mem"] = mem.read(SECRET_SIZE).decode(errors="replace")
    except OSError as exc:
        found["proc_mem"] = None
        found["proc_mem_error"] = exc.strerror


    class IoVec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(SECRET_SIZE)
    local, remote = IoVec(ctypes.addressof(buffer), SECRET_SIZE), IoVec(SECRET_ADDRESS, SECRET_SIZE)
    read = libc.process_vm_readv(TEST_PID, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    found["vm_readv"] = buffer.raw.decode(errors="replace") if read == SECRET_SIZE else None
    found["vm_readv_error"] = os.strerror(ctypes.get_errno()) if read != SECRET_SIZE else None
    try:
        socket.create_connection(("127.0.0.1", PORT), timeout=2).close()
        found["connected"] = True
    except OSError as exc:
        found["connected"] = False
        found["connect_error"] = exc.strerror or str(exc)

    child = os.fork()
    if child == 0:  # double fork: the grandchild has its own session and no parent in the worker
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", MARKER])
        os._exit(0)
    os.waitpid(child, 0)
    time.sleep(0.2)
    raise RuntimeError("probe: " + json.dumps(found))
    """
)


def compile_request(candidate_source: str) -> dict:
    return {
        "mode": "compile",
        "problem_source": PROBLEM,
        "candidate_source": candidate_source,
        "backend": "cpu",
        "size_preset": None,
        "init_seed": 0,
    }


def probe_result(result: dict) -> dict:
    match = re.search(r"RuntimeError: probe: (\{.*\})", result.get("error_excerpt", ""))
    assert match, result
    return json.loads(match.group(1))


def grandchildren() -> list[int]:
    done = subprocess.run(["pgrep", "-f", f"sleep {MARKER}"], capture_output=True, text=True)
    return [int(pid) for pid in done.stdout.split()]


def gone_within(seconds: float) -> list[int]:
    """The marked grandchildren still alive after `seconds` (none, where the sandbox ended them)."""
    deadline = time.monotonic() + seconds
    while (alive := grandchildren()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


@pytest.fixture
def probe(tmp_path):
    """(run, the secret in this process's memory): run() runs the probe candidate in a real worker and
    returns what it found, the worker's result and the grandchildren alive 2 s after run_worker returned."""
    token = secrets.token_hex(8)
    tmp_file, shm_file = Path(f"/tmp/kforge-test-secret-{token}"), Path(f"/dev/shm/kforge-test-secret-{token}")
    project_file = PROJECT_ROOT / f"kforge-sandbox-probe-{token}"
    secret = ctypes.create_string_buffer(f"secret-{token}".encode())
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    constants = {
        "TMP_FILE": str(tmp_file),
        "SHM_FILE": str(shm_file),
        "PROJECT_FILE": str(project_file),
        "TEST_PID": os.getpid(),
        "SECRET_ADDRESS": ctypes.addressof(secret),
        "SECRET_SIZE": len(secret.raw) - 1,
        "PORT": listener.getsockname()[1],
        "MARKER": MARKER,
    }
    source = "".join(f"{name} = {value!r}\n" for name, value in constants.items()) + PROBE
    assert not grandchildren(), "a marked grandchild from an earlier run is still alive"

    def run() -> tuple[dict, dict, list[int]]:
        tmp_file.write_text("the orchestrator's")
        shm_file.write_text("expected outputs")
        try:
            result = run_worker(compile_request(source), Limits(wall_s=90), tmp_path / "kernels")
            alive = gone_within(2.0)
        finally:
            for path in (tmp_file, shm_file, project_file):
                path.unlink(missing_ok=True)
        return probe_result(result), result, alive

    try:
        yield run, secret.value.decode()
    finally:
        listener.close()
        for pid in grandchildren():
            os.kill(pid, 9)


def test_probes_stay_inside_the_sandbox(probe):
    run, secret = probe
    found, result, alive = run()

    assert not found["sees_tmp_file"] and not found["sees_shm_file"], found  # (a) private /tmp and /dev/shm
    assert not found["wrote_project"], found  # (b) the project is read-only (and not the worker's user's)
    assert not found["sees_test_pid"] and not found["signals_test"], found  # (c) its own PID namespace
    assert found["proc_mem"] is None and found["vm_readv"] is None, found  # (d) no other process's memory
    assert not found["connected"], found  # (e) no network, not even the host's loopback
    assert alive == [], f"the setsid grandchild outlived its worker: {alive}"  # (f) the namespace died with it
    assert found["uid"] >= sandbox.UID_BASE, found  # (g) a user of its own, not root
    assert found["user"] == sandbox.SANDBOX_USER, found  # with a name for the tools that ask
    assert result["isolation"] == {layer: "ok" for layer in sandbox.LAYERS}, result["isolation"]  # (h)
    assert result["network_isolated"] is True


def test_probes_escape_without_the_sandbox(probe, monkeypatch):
    """The same probes with KFORGE_SANDBOX=off: each of them gets out, so the test above tests something."""
    run, secret = probe
    monkeypatch.setenv("KFORGE_SANDBOX", "off")
    found, result, alive = run()

    assert found["sees_tmp_file"] and found["sees_shm_file"], found
    assert found["wrote_project"], found
    assert found["sees_test_pid"] and found["signals_test"], found
    assert found["proc_mem"] == secret and found["vm_readv"] == secret, found
    assert found["connected"], found
    assert alive, "without the sandbox the setsid grandchild outlives its worker"
    assert found["uid"] == 0, found
    assert all(state.startswith("refused: disabled") for state in result["isolation"].values()), result
    assert result["network_isolated"] is False


def test_honest_g_plus_plus_kernel_is_correct_in_the_sandbox(tmp_path):
    """load_cpp builds with g++ into the shared kernel cache as the worker's own user, and a second
    worker (another user) loads the artifact the first one built."""
    kernel_cache = tmp_path / "kernels"
    first = run_worker(compile_request(HONEST), Limits(wall_s=120), kernel_cache)
    second = run_worker(compile_request(HONEST), Limits(wall_s=120), kernel_cache)

    assert first["outcome"] == "correct", first
    assert second["outcome"] == "correct", second
    assert first["isolation"] == {layer: "ok" for layer in sandbox.LAYERS}, first["isolation"]
    built = list((kernel_cache / "cpu").glob("*.so"))
    assert len(built) == 1 and built[0].stat().st_uid >= sandbox.UID_BASE, built
    assert (kernel_cache / "cpu").stat().st_mode & 0o7777 == 0o1777


CACHE_PROBE = textwrap.dedent(
    """
    import json, os

    cache = os.environ["KFORGE_KERNEL_CACHE"]
    found = {"uid": os.getuid()}
    # Another worker's file in the harness's build directory (an artifact): no write, no replace.
    for name in [n for n in os.listdir(os.path.join(cache, "cpu")) if n.endswith(".so")]:
        path = os.path.join(cache, "cpu", name)
        found["artifact_writable"] = os.access(path, os.W_OK)
        with open(os.path.join(cache, "cpu", f"planted-{os.getuid()}"), "w") as planted:
            planted.write("not a kernel")
        try:
            os.replace(planted.name, path)
            found["artifact_replaced"] = True
        except OSError as exc:
            found["artifact_replaced"] = exc.strerror
    # A tool cache: what one worker made (a folder, a lock file in it), the next one locks and adds to.
    tool = os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "probe")
    if os.path.isdir(tool):
        with open(os.path.join(tool, "entry.lock"), "r+") as lock:
            lock.write("locked by the next worker")
        with open(os.path.join(tool, f"entry-{os.getuid()}.py"), "w") as entry:
            entry.write("# added")
        found["tool_files"] = sorted(os.listdir(tool))
    else:
        os.makedirs(tool)
        with open(os.path.join(tool, "entry.lock"), "w") as lock:
            lock.write("")
    raise RuntimeError("probe: " + json.dumps(found))
    """
)


def test_kernel_cache_artifacts_are_owner_only_and_tool_caches_shared(tmp_path):
    """Two workers, two users: the second can neither write nor replace the .so the first built, and
    can lock and add to a tool-cache folder the first made (as torch.compile's cache needs)."""
    kernel_cache = tmp_path / "kernels"
    built = run_worker(compile_request(HONEST), Limits(wall_s=120), kernel_cache)
    assert built["outcome"] == "correct", built
    first = probe_result(run_worker(compile_request(CACHE_PROBE), Limits(wall_s=60), kernel_cache))
    second = probe_result(run_worker(compile_request(CACHE_PROBE), Limits(wall_s=60), kernel_cache))

    assert first["uid"] != second["uid"]
    assert second["artifact_writable"] is False and second["artifact_replaced"] == "Operation not permitted", second
    assert second["tool_files"] == sorted(["entry.lock", f"entry-{second['uid']}.py"]), second


def test_worker_signals_and_hangs_end_as_before(tmp_path):
    """The worker is not PID 1 of its namespace (which would ignore these signals): a self-sent SIGSEGV
    and the CPU-time limit's SIGXCPU still end it, and a hung worker's setsid grandchild dies with it."""
    kernel_cache = tmp_path / "kernels"
    segv = run_worker(
        compile_request("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"), Limits(), kernel_cache
    )
    spin = run_worker(compile_request("while True:\n    pass\n"), Limits(wall_s=60, cpu_s=3), kernel_cache)
    hang = textwrap.dedent(
        f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "{MARKER}"])
            os._exit(0)
        time.sleep(600)
        """
    )
    try:
        hung = run_worker(compile_request(hang), Limits(wall_s=6), kernel_cache)
        alive = gone_within(2.0)
    finally:
        for pid in grandchildren():
            os.kill(pid, 9)

    assert (segv["outcome"], segv["error_class"]) == ("runtime_error", "SIGSEGV"), segv
    assert (spin["outcome"], spin["error_class"]) == ("timeout", "cpu_time_limit"), spin
    assert (hung["outcome"], hung["error_class"]) == ("timeout", "wall_time_limit"), hung
    assert alive == [], f"the hung worker's setsid grandchild outlived it: {alive}"


HOLDER = """
import itertools, sys
from pathlib import Path
from tasks.harness import sandbox
sandbox.UID_LOCKS = Path(sys.argv[1])
sandbox._uid_counter = itertools.count(0)  # the same start as the test's: without the locks, the same ids
print(" ".join(str(sandbox.next_uid()) for _ in range(3)), flush=True)
sys.stdin.readline()  # held until the test is done
"""


def test_two_kforge_processes_on_one_host_never_hand_out_the_same_user_id(tmp_path, monkeypatch):
    """Another kforge process (a nightly run beside `kforge eval`) holds three ids; this one, counting
    from the same start, skips them, and gets the first one back once that is released."""
    import itertools

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        cwd=PROJECT_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        theirs = [int(uid) for uid in holder.stdout.readline().split()]
        monkeypatch.setattr(sandbox, "UID_LOCKS", tmp_path)
        monkeypatch.setattr(sandbox, "_uid_counter", itertools.count(0))
        ours = [sandbox.next_uid() for _ in range(3)]
        assert theirs == [sandbox.UID_BASE + i for i in range(3)], theirs
        assert ours == [sandbox.UID_BASE + i for i in range(3, 6)], ours
        sandbox.release_uid(ours[0])
        monkeypatch.setattr(sandbox, "_uid_counter", itertools.count(3))
        assert sandbox.next_uid() == ours[0]
    finally:
        holder.stdin.close()
        holder.wait(10)
        for uid in list(sandbox._held_uids):
            if sandbox.UID_BASE <= uid < sandbox.UID_BASE + 6:
                sandbox.release_uid(uid)
