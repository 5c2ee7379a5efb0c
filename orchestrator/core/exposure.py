"""Safe defaults for what the project runs on a machine (torch-free): no telemetry, a private
Ray token.

- **Telemetry.** Ray reports usage statistics and MLflow sends client telemetry unless told
  not to; every ``lime`` process (and a sweep's Ray workers) tells them not to:
  ``RAY_USAGE_STATS_ENABLED=0`` and ``MLFLOW_DISABLE_TELEMETRY=true``, unless the variables are
  set already or ``LIME_TELEMETRY=1`` turns both back on.
- **The Ray token.** Ray writes ``~/.ray/auth_token`` (the secret that lets a process join or
  drive the cluster) with the process's umask, usually 0644: readable by every user of the
  machine. ``private_token_file`` creates it 0600 before Ray would, or narrows an existing one
  of this user to 0600.
"""
from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

TELEMETRY_ENV = "LIME_TELEMETRY"
TELEMETRY_OFF = {"RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true"}


def telemetry_env() -> dict[str, str]:
    """The variables that turn telemetry off ({} when ``LIME_TELEMETRY=1`` keeps it on)."""
    if os.environ.get(TELEMETRY_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return {}
    return {k: os.environ.get(k, v) for k, v in TELEMETRY_OFF.items()}


def quiet_telemetry() -> None:
    """Telemetry off in this process (and what it starts), unless the user said otherwise."""
    for k, v in telemetry_env().items():
        os.environ.setdefault(k, v)


def token_path() -> Path | None:
    """The token file Ray reads on this machine (None when the token comes from ``$RAY_AUTH_TOKEN``)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return None
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").expanduser()


def private_token_file(create: bool = True) -> Path | None:
    """Make the Ray token file private (0600): with ``create``, create it so when Ray would create
    it (a local Ray with token authentication, the default); narrow it when it is this user's and
    readable by others. Returns the file, or None when there is none."""
    path = token_path()
    if path is None:
        return None
    if not path.exists():
        if not create or os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled" \
                or os.environ.get("RAY_AUTH_TOKEN_PATH"):
            return None  # Ray creates no token then (a named path must exist already)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:  # as Ray's generator writes it: 256 random bits in hex
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # created meanwhile by another process: narrowed below
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
            return path
    try:
        st = path.stat()
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    except OSError:  # another user's file, or a read-only one: Ray reads it as it is
        pass
    return path
