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
- **Exposure.** A local Ray listens on every interface (its GCS, raylet and worker ports accept
  connections from the network); a local sweep's Ray binds to 127.0.0.1 instead (``loopback``).
  Ray writes ``~/.ray/auth_token`` readable by everyone (0644): the driver creates it 0600 when
  it is missing and narrows it to 0600 when it is this user's. Ray's usage statistics are off
  (``orchestrator.core.exposure``).
- **What a trial needs.** A trial asking for more CPUs or GPUs than any node of the cluster has
  would wait forever (Ray prints nothing): ``check_fits`` refuses it with one line after the
  connection and before anything is recorded.
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
from orchestrator.core import exposure
from orchestrator.sweep.mlflow_runs import WORKER_ENV

TIMEOUT_ENV = "LIME_CONNECT_TIMEOUT"
DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 3600.0  # an hour: Ray's own retries give up after ~14 minutes anyway
DRIVER_LOG = "driver.log"  # Ray's own output of the driver process, in results/ray/<sweep>/
AUTH_REFUSED = ("InvalidAuthToken", "Unauthenticated", "AuthenticationError")
PRINT_PATCH = "RAY_TRAIN_ENABLE_PRINT_PATCH"
CONNECT_THREAD = "lime-ray-connect"
# Ray picks a loopback node address (so every server of the node listens on 127.0.0.1 only) when
# it believes multi-node clusters are off; on Linux they are on unless this variable says 0
RAY_CLUSTERS_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


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
        t = float("nan")
    if not 0 < t <= MAX_TIMEOUT:  # also nan and inf
        raise ConfigError(f"{src}: must be a number of seconds > 0 and at most {MAX_TIMEOUT:g}, got {value!r}")
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
    exposure.quiet_telemetry()  # before Ray reads its configuration
    token = use_token_if_available() if address else None
    if address:
        exposure.private_token_file(create=False)  # a copied token: this user's only
    import ray

    if ray.is_initialized():
        return False
    common = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                  configure_logging=True)
    os.environ.setdefault(PRINT_PATCH, "0")  # Ray Train would print a worker's lines twice (print and log)
    _messages_to_log()
    if not address:
        exposure.private_token_file()  # Ray would write ~/.ray/auth_token world-readable
        with loopback():
            ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, **common)  # never a stray `ray start`
        exposure.private_token_file()
        return True
    if hostport:
        probe(*hostport, timeout)
    env = {"MLFLOW_TRACKING_URI": uri, "RAY_AIR_NEW_OUTPUT": "0", PRINT_PATCH: os.environ[PRINT_PATCH],
           **exposure.telemetry_env()}
    env.update({k: os.environ[k] for k in WORKER_ENV if os.environ.get(k)})
    # Ray retries a refused connection once a second; the timeout below bounds the whole attempt
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(max(1, int(timeout))))
    _init_within(address, timeout, log, token, dict(runtime_env={"env_vars": env}, **common))
    return True


@contextlib.contextmanager
def loopback() -> Iterator[None]:
    """A local Ray started inside binds its node to 127.0.0.1: Ray's processes inherit the
    variable when they start, this process reads Ray's constant at ``ray.init``. Both are put
    back after, so a later connection to a cluster in this process uses the real address."""
    from ray._private import ray_constants

    old_env, old_const = os.environ.get(RAY_CLUSTERS_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[RAY_CLUSTERS_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old_const
        if old_env is None:
            os.environ.pop(RAY_CLUSTERS_ENV, None)
        else:
            os.environ[RAY_CLUSTERS_ENV] = old_env


def check_fits(per_trial: dict[str, float], address: str, workers: int = 1) -> None:
    """Every resource a trial (each of its ``workers``) asks for is on at least one alive node of
    the cluster Ray is connected to: else one line naming the resource (before anything is
    recorded; Ray would keep the trial pending forever without a word)."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    names = {"CPU": ("resources.cpu", "CPUs"), "GPU": ("resources.gpu", "GPUs")}
    for res, need in per_trial.items():
        if need <= 0:
            continue
        best = max((float(n.get(res, 0.0)) for n in nodes), default=0.0)
        if need > best:
            key, what = names.get(res, (f"resources.{res}", res))
            each = " per worker" if workers > 1 else " per trial"
            raise ConnectError(f"{key}: {need:g}{each}, but no node of the cluster at {address} has that many "
                               f"{what} (the most on one node: {best:g}, {len(nodes)} node(s)); lower it or add "
                               "nodes that have them")


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
