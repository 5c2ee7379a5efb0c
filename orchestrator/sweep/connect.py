"""Connecting the sweep driver to Ray: a local Ray, or a running cluster (``--address``).

What Ray does on its own, and why this module exists:

- **Token authentication.** Any local ``ray.init()`` writes ``~/.ray/auth_token``; from then on
  ``ray start --head`` on that machine enables token authentication, but a driver that connects
  to an explicit address does not send the token unless ``RAY_AUTH_MODE=token`` is exported, and
  fails after ~20 s of ``InvalidAuthToken`` lines. Here: when ``RAY_AUTH_MODE`` is unset and a
  token is available (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``), the
  driver uses it (a cluster without authentication ignores it); a refused token is one line
  saying which token to copy or export.
- **A dead or wrong address.** Ray retries a GCS connection 20 times for ~40 s each (about 14
  minutes). Here: a TCP probe of the address, then ``ray.init`` in a helper thread, bounded by
  the connect timeout (``--connect-timeout`` / ``$LIME_CONNECT_TIMEOUT``, default 30 s); past it,
  one line and exit 2. Ray's own retry messages go to the sweep's driver log, not the console.
- **Ray Client (``ray://``)** is refused with one line: Tune would run the sweep's driver loop on
  the head node (the console, the live view and the results folder would be there), so the
  driver runs on a node of the cluster and connects to the GCS address instead.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from lime_arch.errors import ConfigError
from orchestrator.sweep.mlflow_runs import WORKER_ENV

TIMEOUT_ENV = "LIME_CONNECT_TIMEOUT"
DEFAULT_TIMEOUT = 30.0
DRIVER_LOG = "driver.log"  # Ray's own output of the driver process, in results/ray/<sweep>/
AUTH_REFUSED = ("InvalidAuthToken", "Unauthenticated", "AuthenticationError")
PRINT_PATCH = "RAY_TRAIN_ENABLE_PRINT_PATCH"
CONNECT_THREAD = "lime-ray-connect"


class ConnectError(ConfigError):
    """The cluster cannot be reached or refuses this driver: one line, exit code 2."""


def connect_timeout(value: float | str | None = None) -> float:
    """The connect timeout in seconds: ``value`` (the flag), else ``$LIME_CONNECT_TIMEOUT``, else 30."""
    src = "--connect-timeout"
    if value is None:
        value, src = os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT, TIMEOUT_ENV
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{src}: must be a number of seconds > 0, got {value!r}") from None
    if not t > 0:
        raise ConfigError(f"{src}: must be a number of seconds > 0, got {value!r}")
    return t


@contextlib.contextmanager
def output_to(path: Path) -> Iterator[None]:
    """Send this process's stderr (fd level: Python, Ray's C++ core, warnings) to ``path``.

    Ray's internal tracebacks and retry messages (e.g. the checkpoint manager's
    FileNotFoundError on a resume) land there instead of on the console; stdout (the live view)
    stays on the console."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a", buffering=1)
    f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} lime sweep driver (pid {os.getpid()})\n")
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        if any(t.name == CONNECT_THREAD and t.is_alive() for t in threading.enumerate()):
            # a connection attempt given up on still retries inside Ray's C++ core and writes to
            # fd 2 until the process exits: fd 2 stays on the log, Python's stderr is the console
            sys.stderr = os.fdopen(saved, "w", buffering=1)
        else:
            os.dup2(saved, 2)
            os.close(saved)
            f.close()


def token_source() -> str | None:
    """Where Ray would read this machine's authentication token from, or None."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "$RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return path if Path(path).expanduser().is_file() else None
    default = Path.home() / ".ray" / "auth_token"
    return str(default) if default.is_file() else None


def use_token_if_available() -> str | None:
    """Set ``RAY_AUTH_MODE=token`` when it is unset and a token exists; the token's source."""
    src = token_source()
    if src and "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_MODE"] = "token"
        if "ray._raylet" in sys.modules:  # Ray read its configuration already: read it again, as Ray does
            with contextlib.suppress(Exception):
                sys.modules["ray._raylet"].Config.initialize("")
    return src


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a ``host:port`` GCS address; None for ``auto``."""
    if address.startswith("ray://"):
        raise ConfigError(f"--address {address}: Ray Client (ray://) addresses are not supported: Tune would run "
                          "the sweep's driver loop on the head node; run `lime sweep run` on a node of the cluster "
                          "with --address <head>:6379 (the GCS port of `ray start --head`)")
    if address == "auto":
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"--address {address}: expected HOST:PORT, the GCS address printed by "
                          "`ray start --head` (default port 6379)")
    return host.strip("[]"), int(port)


def probe(host: str, port: int, timeout: float) -> None:
    """A TCP connection to the address within ``timeout`` (Ray itself would retry for minutes)."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        why = "timed out" if isinstance(e, (TimeoutError, socket.timeout)) else (e.strerror or type(e).__name__)
        raise ConnectError(f"--address {host}:{port}: no Ray cluster reachable ({why} within {timeout:g} s); "
                           f"start it with `ray start --head --port {port}` or fix the address "
                           f"(timeout: --connect-timeout or ${TIMEOUT_ENV})") from None


def start_ray(address: str | None, *, uri: str, num_cpus: int | None, timeout: float, log: Path) -> bool:
    """Connect to ``address`` or start a local Ray; True when this call started or connected it
    (so the caller shuts it down). Call inside ``output_to(log)``."""
    hostport = split_address(address) if address else None
    token = use_token_if_available() if address else None  # before Ray reads its configuration
    import ray

    if ray.is_initialized():
        return False
    common = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                  configure_logging=True)
    os.environ.setdefault(PRINT_PATCH, "0")  # Ray Train would print a worker's lines twice (print and log)
    _messages_to_log()
    if not address:
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, **common)  # never a stray `ray start`
        return True
    if hostport:
        probe(*hostport, timeout)
    env = {"MLFLOW_TRACKING_URI": uri, "RAY_AIR_NEW_OUTPUT": "0", PRINT_PATCH: os.environ[PRINT_PATCH]}
    env.update({k: os.environ[k] for k in WORKER_ENV if os.environ.get(k)})
    # Ray retries a refused connection once a second; the timeout below bounds the whole attempt
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(max(1, int(timeout))))
    _init_within(address, timeout, log, token, dict(runtime_env={"env_vars": env}, **common))
    return True


def _messages_to_log() -> None:
    """Ray prints the cluster's warnings (``(raylet) WARNING: ...``) to the driver's stdout, the
    console's live view; send them to stderr, which ``output_to`` puts in the driver log."""
    try:
        import ray._private.worker as ray_worker

        show = ray_worker.print_to_stdstream
    except (ImportError, AttributeError):  # another Ray version: its messages stay on the console
        return
    if getattr(show, "lime_to_log", False):
        return

    def to_stderr(data, ignore_prefix):
        show({**data, "is_err": True}, ignore_prefix)

    to_stderr.lime_to_log = True
    ray_worker.print_to_stdstream = to_stderr


def _init_within(address: str, timeout: float, log: Path, token: str | None, kwargs: dict) -> None:
    """``ray.init(address)`` in a helper thread, given up after ``timeout`` or at the first
    authentication failure in Ray's log (a thread stuck in Ray's C++ retries does not keep the
    process alive: the CLI exits)."""
    import ray

    box: dict[str, BaseException | bool] = {}

    def init() -> None:
        try:
            ray.init(address=address, **kwargs)
            box["ok"] = True
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            box["error"] = e

    start = log.stat().st_size if log.is_file() else 0
    th = threading.Thread(target=init, name=CONNECT_THREAD, daemon=True)
    th.start()
    deadline = time.monotonic() + timeout
    while th.is_alive() and time.monotonic() < deadline:
        th.join(0.2)
        if _refused(log, start):
            raise ConnectError(_auth_message(address, token))
    if th.is_alive():
        raise ConnectError(f"--address {address}: no answer from Ray within {timeout:g} s (is it a Ray GCS port, "
                           f"and the same Ray version?); Ray's messages are in {log} "
                           f"(timeout: --connect-timeout or ${TIMEOUT_ENV})")
    err = box.get("error")
    if err is not None:
        if _refused(log, start) or any(w in f"{type(err).__name__} {err}" for w in AUTH_REFUSED):
            raise ConnectError(_auth_message(address, token)) from None
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ConnectError(f"--address {address}: Ray could not connect ({type(err).__name__}: {first}); "
                           f"Ray's messages are in {log}") from None


def _refused(log: Path, start: int) -> bool:
    try:
        with open(log, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return False
    return any(w in text for w in AUTH_REFUSED)


def _auth_message(address: str, token: str | None) -> str:
    if token is None:
        return (f"--address {address}: the cluster requires token authentication and this machine has no token; "
                "copy the head node's ~/.ray/auth_token to ~/.ray/auth_token here (or export RAY_AUTH_TOKEN=<it>)")
    mode = os.environ.get("RAY_AUTH_MODE", "")
    if mode.lower() != "token":
        return (f"--address {address}: the cluster requires token authentication but RAY_AUTH_MODE={mode}; "
                "export RAY_AUTH_MODE=token (the head node's token is read from ~/.ray/auth_token)")
    return (f"--address {address}: the cluster refused the token from {token}; use the head node's token: copy "
            "its ~/.ray/auth_token here (or export RAY_AUTH_TOKEN=<it>)")
