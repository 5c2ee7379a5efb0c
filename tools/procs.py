"""Local processes for checks that start real servers (``make dashboard-check``, the cluster
tests): a free port, a process in a session of its own that is ended by its PID, the processes a
private temp folder names, and waiting for an HTTP endpoint. Stdlib only."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A local TCP port nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def send(pid: int, sig: int, group: bool = False) -> None:
    """``kill`` (or ``killpg``) that ignores a process already gone."""
    try:
        os.killpg(pid, sig) if group else os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def pids_naming(marker: str) -> list[int]:
    """Processes whose command line contains ``marker`` (a private temp folder of the caller)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if marker in (d / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


class Proc:
    """A process in a session of its own, its output in ``log``; ``stop`` ends its process group
    and every process that ``marker`` names (what it started outside its group)."""

    def __init__(self, argv: list[str], log: Path, env: dict, marker: str | None = None):
        self.log, self.marker = log, marker
        self.f = open(log, "ab")
        self.p = subprocess.Popen(argv, stdout=self.f, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_for(self, what: str, timeout: float) -> None:
        """Until ``what`` appears in the log (RuntimeError with the log's tail if not in time)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if what in self.log.read_text(errors="replace"):
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"{self.log.name}: no {what!r} within {timeout:g} s:\n" + self.log.read_text()[-3000:])

    def stop(self, grace: float = 20.0, term_group: bool = False) -> None:
        """SIGTERM (the leader, or its group), ``grace`` seconds, then SIGKILL to the group and
        to what ``marker`` names. ``ray start --block`` stops its node when the leader is told."""
        if self.p.poll() is None:
            send(self.p.pid, signal.SIGTERM, group=term_group)
            try:
                self.p.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        send(self.p.pid, signal.SIGKILL, group=True)
        for pid in pids_naming(self.marker) if self.marker else []:
            send(pid, signal.SIGKILL)
        self.p.wait()
        self.f.close()


def wait_http(url: str, timeout: float, proc: Proc | None = None) -> None:
    """Until ``url`` answers 200 (RuntimeError if not in time, or when ``proc`` has ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc is not None and proc.p.poll() is not None:
            break
        time.sleep(0.3)
    tail = "" if proc is None else ":\n" + proc.log.read_text(errors="replace")[-3000:]
    raise RuntimeError(f"{url}: no answer within {timeout:g} s{tail}")


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc's parent links)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(c for c, pp in parent.items() if pp == p)
    return out


def _hex_ip(h: str) -> str:
    """An address of /proc/net/tcp{,6} (little-endian 32-bit words) as text."""
    import ipaddress

    raw = bytes.fromhex(h)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket these processes listen on (Linux /proc)."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] == "0A" and f[9] in inodes:  # state LISTEN
                ip, port = f[1].split(":")
                out.append((inodes[f[9]], _hex_ip(ip), int(port, 16)))
    return out
