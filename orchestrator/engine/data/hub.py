"""The Hugging Face hub, for the ``hf`` source only: reached when a config names something on it,
and when it cannot be reached, one line within seconds instead of minutes of retries.

Before the ``hf`` source loads anything it asks what the trial needs from the hub (``needs``: a
dataset named on the hub rather than a local ``save_to_disk`` folder, a tokenizer named rather
than a local ``tokenizer.json``; a ``bpe`` tokenizer is trained here). If something is needed and
``HF_HUB_OFFLINE`` is not set, one TCP connection to the hub's endpoint (``HF_ENDPOINT``, default
https://huggingface.co) is tried with a short timeout; without an answer the trial stops with a
``ConfigError`` naming the offline alternatives. With ``HF_HUB_OFFLINE`` (or
``HF_DATASETS_OFFLINE``) set, nothing is downloaded: what is missing from the Hugging Face cache
is the same kind of one-line error. These errors are the user's to fix, so a sweep does not retry
them (``orchestrator.sweep.mlflow_runs.report_config_error``).
"""
from __future__ import annotations

import os
import socket
import threading
import urllib.parse

from lime_arch import ConfigError

PROBE_TIMEOUT_S = 3.0
OFFLINE_HINT = ("to run without the hub: set HF_HUB_OFFLINE=1 with the dataset and tokenizer already in the "
                "Hugging Face cache, or give data.tokenizer as a local tokenizer.json file (or bpe, trained "
                "here) and data.hf_name as a local save_to_disk folder")


def offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def tokenizer_name(tokenizer: str) -> str | None:
    """The hub tokenizer a ``data.tokenizer`` of the hf source means (None: nothing from the hub)."""
    if tokenizer == "bpe":
        return None
    name = "gpt2" if tokenizer == "byte" else tokenizer  # byte tokens would make a tiny model of web text
    return None if os.path.isfile(os.path.expanduser(name)) else name


def needs(cfg) -> list[str]:
    """What a ``DataConfig`` of the hf source fetches from the hub, in words."""
    out = []
    if not os.path.isdir(os.path.expanduser(cfg.hf_name)):
        out.append(f"the dataset {cfg.hf_name}")
    tok = tokenizer_name(cfg.tokenizer)
    if tok:
        out.append(f"the tokenizer {tok!r}")
    return out


def unreachable(timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the hub's endpoint does not answer (None when a TCP connection to it succeeds). The
    probe runs in a thread so that a slow name lookup cannot hold the trial longer than ``timeout``."""
    url = urllib.parse.urlparse(endpoint())
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    result: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(None)
        except OSError as e:
            result.append(e.strerror or type(e).__name__)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return result[0] if result else f"no answer within {timeout:g} s"


def check_reachable(cfg) -> None:
    """Before the hf source loads anything: a ConfigError when it needs the hub and cannot reach it."""
    wanted = needs(cfg)
    if not wanted or offline():
        return
    why = unreachable()
    if why is not None:
        raise ConfigError(f"data.source: hf needs {' and '.join(wanted)} from the Hugging Face hub, which is not "
                          f"reachable from this machine ({endpoint()}: {why}); {OFFLINE_HINT}")


def tokenizer_file(name: str) -> str:
    """The ``tokenizer.json`` of a hub tokenizer: from the cache when offline, else downloaded once."""
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(name, "tokenizer.json", local_files_only=offline())
    except Exception as e:  # noqa: BLE001 - a missing repo, no network, not in the cache: the user's to fix
        where = "is not in the Hugging Face cache (HF_HUB_OFFLINE is set)" if offline() else "cannot be loaded"
        raise ConfigError(f"data.tokenizer: the tokenizer {name!r} {where} ({type(e).__name__}: "
                          f"{_first_line(e)}); {OFFLINE_HINT}") from None


def load_dataset(cfg):
    """``datasets.load_dataset`` of a hub name, its failures as one line."""
    import datasets

    try:
        return datasets.load_dataset(cfg.hf_name, cfg.hf_config, split=cfg.hf_split, streaming=cfg.hf_streaming)
    except Exception as e:  # noqa: BLE001 - a missing dataset, config or split, no network: the user's to fix
        where = " (HF_HUB_OFFLINE is set: only the cache is read)" if offline() else ""
        raise ConfigError(f"data.hf_name: cannot load the dataset {cfg.hf_name} (config {cfg.hf_config}, split "
                          f"{cfg.hf_split}){where}: {type(e).__name__}: {_first_line(e)}; {OFFLINE_HINT}") from None


def _first_line(e: BaseException) -> str:
    lines = [s.strip() for s in str(e).splitlines() if s.strip()]
    return lines[0][:300] if lines else "no message"
