"""A fork server for the tools the lit suite and the doc tests run: each command is a fork of one
process that has already imported the tools, instead of a new interpreter that imports them
again.

The lit suite runs some 900 commands (tlc-opt, tlc-run, ..., `%roundtrip`, filecheck) and the
docs' shell blocks some 140; as separate processes most of their CPU time was start-up: ~0.4 s
of imports for a tool whose work on a small file takes milliseconds. `start()` (from
tests/lit/lit.cfg.py and tests/test_docs.py) starts this module as a server that imports every
tool once, and writes a small client script per tool name into a directory put first on the
commands' PATH. A command `tlc-opt ARGS` then runs the client (an interpreter without `site`,
~20 ms), which connects to the server and hands it its argv, working directory, environment and
its stdin, stdout and stderr (the file descriptors themselves); the server forks a worker that
takes them over, makes sys.stdin/stdout/stderr for them as the interpreter does at start-up,
and runs the tool's entry point as its console script does (`sys.exit(main())`, then atexit
handlers and the final flush; an uncaught exception prints its traceback and exits 1), and the
client exits with the worker's status (a worker killed by a signal kills the client with the
same signal). What the commands print, read and exit with is the tools' own; only the
interpreter start and the imports are shared (so is what a library reads from the environment
while it is imported, such as OpenBLAS's thread count: no command here sets it; tlc's own
variables, TLC_MAX_ELEMENTS and the cache's, are read when used).

`TLC_FRESH_TOOLS=1` turns it off (every command a new process, as before); the tools' real start
from their console scripts is tested by the pytest tests that run them as subprocesses
(tests/test_codegen_targets.py, test_api.py, test_verify.py ...).
The server ends when the process that started it (lit, pytest) ends, and is waited for:
`time lit ...` counts the commands' CPU time as before.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import socket
import sys
from collections.abc import Callable

ENV_FRESH = "TLC_FRESH_TOOLS"
#: tool name -> (module, function): the entry points of pyproject.toml's scripts, the
#: `python -m tlc.tools.roundtrip` of lit's `%roundtrip`, and FileCheck's.
TOOLS = {
    "tlc-opt": ("tlc.tools.opt", "main"),
    "tlc-run": ("tlc.tools.run", "main"),
    "tlc-translate": ("tlc.tools.translate", "main"),
    "tlc-compile": ("tlc.tools.compile", "main"),
    "tlc-verify": ("tlc.tools.verify", "main"),
    "tlc-roundtrip": ("tlc.tools.roundtrip", "main"),
    "filecheck": ("filecheck.main", "main"),
}
#: the servers: tools -> modules imported beyond theirs. tlc-translate's has PyTorch's and ONNX's
#: importers loaded (torch with dynamo is ~2 s of a `--import-torch` run); the rest are forked
#: from a smaller process (a fork costs ~5 ms, ~17 ms with torch loaded).
SERVERS = {
    ("tlc-translate",): ("torch", "torch._dynamo", "torch.fx", "onnx"),
    ("tlc-opt", "tlc-run", "tlc-compile", "tlc-verify", "tlc-roundtrip", "filecheck"): (),
}
HEADER = 8  # bytes of the request's length


def client(name: str, sockets: str) -> None:
    """The command `name`: run it in a worker of the server listening in `sockets`, exit as
    the worker did."""
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    argv0 = next(
        (
            os.path.join(d, name)
            for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and os.path.abspath(d) != here and os.access(os.path.join(d, name), os.X_OK)
        ),
        name,
    )
    request = marshal.dumps(
        {"argv": [argv0, *sys.argv[1:]], "cwd": os.getcwd(), "env": dict(os.environ)}
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(os.path.join(sockets, f"{name}.sock"))
        message = len(request).to_bytes(HEADER, "big") + request
        sent = socket.send_fds(conn, [message], [0, 1, 2])
        conn.sendall(message[sent:])
        reply = b""
        while chunk := conn.recv(64):
            reply += chunk
    status = int(reply) if reply else 70
    if status < 0:  # killed by signal -status
        import signal

        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < HEADER or len(data) < HEADER + int.from_bytes(data[:HEADER], "big"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise EOFError("the client closed its connection mid-request")
        data += chunk
    return marshal.loads(data[HEADER:]), fds


def _serve(sockets: str, made: list[str], tools: list[str], parent: int) -> tuple[str, list[str]]:
    """Accept commands for `tools` on SOCKETS/TOOL.sock until SIGTERM or until `parent`
    ends, then remove the directories `made`; returns only in a worker, with its tool and
    argv. Every child is waited for, so the commands' CPU time adds up in the server's, and
    the server's in that of whoever waits for it (lit, `time`)."""
    import selectors
    import signal

    listeners = {}
    for tool in tools:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(os.path.join(sockets, f"{tool}.sock"))
        listener.listen(64)
        listeners[listener] = tool
    wake_read, wake_write = socket.socketpair()
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno())
    signal.signal(signal.SIGTERM, lambda *_: None)  # wakes the selector; the loop then ends
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes it to reap the handler
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    selector = selectors.DefaultSelector()
    for listener in listeners:
        selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    running = 0
    while os.getppid() == parent:
        ready = {key.fileobj for key, _ in selector.select(timeout=1.0)}
        if wake_read in ready and signal.SIGTERM in wake_read.recv(64):
            break
        while running and os.waitpid(-1, os.WNOHANG)[0]:
            running -= 1
        for listener in ready & listeners.keys():
            conn, _ = listener.accept()
            if os.fork() == 0:  # the handler of this command
                signal.set_wakeup_fd(-1)
                for signum in (signal.SIGTERM, signal.SIGCHLD):
                    signal.signal(signum, signal.SIG_DFL)
                for resource in (selector, *listeners, wake_read, wake_write):
                    resource.close()
                return _handle(conn, listeners[listener])
            conn.close()
            running += 1
    for listener in listeners:
        listener.close()
    for _ in range(running):
        os.wait()
    import shutil  # also when the parent was killed before it could remove them

    for directory in made:
        shutil.rmtree(directory, ignore_errors=True)
    sys.exit(0)


def _handle(conn: socket.socket, tool: str) -> tuple[str, list[str]]:
    """Receive one command, fork its worker (which returns its tool and argv) and send the
    client the worker's exit status (negative: the signal that killed it)."""
    try:
        request, fds = _receive(conn)
    except (OSError, EOFError, ValueError):
        os._exit(1)
    worker = os.fork()
    if worker == 0:
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        return tool, request["argv"]
    for fd in fds:
        os.close(fd)
    _, status = os.waitpid(worker, 0)
    with contextlib.suppress(OSError):  # the client is gone: nobody to tell
        conn.sendall(str(os.waitstatus_to_exitcode(status)).encode())
    os._exit(0)


def start(env: dict[str, str]) -> str:
    """Start the servers for the calling process (lit, pytest) in the tests' environment `env`
    (its PYTHONHASHSEED is the workers'); returns the directory of the tool commands (to put
    first on the commands' PATH). It is made under tests/lit/Output, which lit writes to
    anyway (a temporary directory may be mounted noexec), the sockets in a temporary one
    (their paths must be short); both are removed when the calling process ends."""
    import atexit
    import shutil
    import subprocess
    import tempfile

    tests = os.path.dirname(os.path.abspath(__file__))
    output = os.path.join(tests, "lit", "Output")
    os.makedirs(output, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="tools-", dir=output)
    sockets = tempfile.mkdtemp(prefix="tlc-tools-")
    for name in TOOLS:
        script = os.path.join(directory, name)
        with open(script, "w") as f:
            f.write(
                f"#!{sys.executable} -IS\n"
                f"import sys; sys.path.insert(0, {tests!r})\n"
                f"from toolserver import client; client({name!r}, {sockets!r})\n"
            )
        os.chmod(script, 0o755)
    starter = os.getpid()
    servers = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), directory, sockets, str(starter), *tools],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for tools in SERVERS
    ]
    for server in servers:
        assert server.stdout is not None
        if server.stdout.readline() != "ready\n":
            raise RuntimeError(f"a tool server did not start (exit {server.wait()})")
        server.stdout.close()

    def stop() -> None:
        if os.getpid() == starter:  # not in lit's forked workers
            for server in servers:
                server.terminate()
            for server in servers:
                server.wait()
            for made in (directory, sockets):
                shutil.rmtree(made, ignore_errors=True)

    atexit.register(stop)
    return directory


_STARTED: list[str] = []


def commands() -> list[str]:
    """For pytest: the directory of the tool commands (to put first on PATH), the servers
    started on first use; empty with TLC_FRESH_TOOLS=1 (the installed scripts run)."""
    if os.environ.get(ENV_FRESH) == "1":
        return []
    if not _STARTED:
        _STARTED.append(start(dict(os.environ)))
    return list(_STARTED)


def _exit_code(exc: SystemExit) -> int:
    """The exit status the interpreter gives `sys.exit(value)` (a non-integer is printed)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    sys.stderr.write(f"{exc.code}\n")
    return 1


def _fresh_stdio() -> None:
    """New sys.stdin, stdout and stderr over file descriptors 0-2 (now the client's), made as
    the interpreter makes them at start-up: the server's were made for its own descriptors
    (/dev/null is seekable, a pipe is not; a terminal is line-buffered)."""
    import io

    for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
        buffered = io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(
            buffered,
            encoding=old.encoding,
            errors=old.errors,
            newline="\n",
            line_buffering=fd == 2 or os.isatty(fd),
            write_through=old.write_through,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _run(main: Callable[[], object]) -> None:
    """`sys.exit(main())` and the interpreter's exit: atexit handlers, the final flush of
    stdout and stderr (exit 120 when it fails, as Python's). Not the teardown of every module
    (in a fresh process it frees what it imported; in a fork that is the server's whole heap,
    copied page by page only to be freed: 0.1-0.2 s a command)."""
    import atexit
    import traceback

    try:
        code = _exit_code(SystemExit(main()))
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = 120
    os._exit(code)


if __name__ == "__main__":
    import gc
    import importlib

    commands, sockets, parent, tools = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    entries = {name: importlib.import_module(TOOLS[name][0]) for name in tools}
    for module in SERVERS[tuple(tools)]:
        with contextlib.suppress(ImportError):  # an optional extra's tests are skipped
            importlib.import_module(module)
    gc.freeze()  # what was imported is never collected: the workers' collections skip it
    tool, argv = _serve(sockets, [commands, sockets], tools, parent)
    # a worker: run the tool as its console script does (`python -m` for the roundtrip)
    module, function = TOOLS[tool]
    if tool == "tlc-roundtrip":
        argv[0] = entries[tool].__file__
        sys.path[0] = os.getcwd()
    else:
        sys.path[0] = os.path.dirname(argv[0])
    sys.argv = argv
    _fresh_stdio()
    _run(getattr(entries[tool], function))
