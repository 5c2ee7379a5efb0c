"""tests/isolation.py: what a test changes in the process is put back, and what it leaves is named.
Each case changes one thing by hand after taking a snapshot, then checks the process against values
read here independently (os, signal, torch, threading), not against the snapshot's own fields."""
import os
import re
import signal
import threading

import pytest
import torch

from tests import isolation
from tests.isolation import LeftBehind, ProcessState


def test_the_environment_goes_back_without_a_report(monkeypatch):
    monkeypatch.setenv("LIME_ISOLATION_KEPT", "before")
    monkeypatch.delenv("LIME_ISOLATION_NEW", raising=False)
    state = ProcessState.take()
    os.environ["LIME_ISOLATION_KEPT"] = "after"
    os.environ["LIME_ISOLATION_NEW"] = "1"
    assert state.restore() == []
    assert os.environ["LIME_ISOLATION_KEPT"] == "before"
    assert "LIME_ISOLATION_NEW" not in os.environ


def test_a_changed_working_directory_goes_back_and_is_named(tmp_path):
    home = os.getcwd()
    state = ProcessState.take()
    os.chdir(tmp_path)
    assert state.restore() == [f"working directory {tmp_path}"]
    assert os.getcwd() == home


def test_a_working_directory_removed_under_the_test_goes_back_and_is_named(tmp_path):
    home, gone = os.getcwd(), tmp_path / "gone"
    gone.mkdir()
    state = ProcessState.take()
    os.chdir(gone)
    gone.rmdir()
    assert state.restore() == ["working directory removed"]
    assert os.getcwd() == home


def test_a_signal_handler_goes_back_and_is_named():
    def handler(signum, frame):  # never called: only installed
        raise AssertionError("SIGUSR1 delivered")

    old = signal.getsignal(signal.SIGUSR1)
    state = ProcessState.take()
    signal.signal(signal.SIGUSR1, handler)
    try:
        assert state.restore() == ["handler of SIGUSR1"]
        assert signal.getsignal(signal.SIGUSR1) == old
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_torch_s_threads_go_back_without_a_report():
    n = torch.get_num_threads()
    state = ProcessState.take()
    torch.set_num_threads(n + 1)
    try:
        assert state.restore() == []
        assert torch.get_num_threads() == n
    finally:
        torch.set_num_threads(n)


def test_a_thread_still_running_is_named_and_one_that_ended_is_not():
    state = ProcessState.take()
    done, stop = threading.Thread(target=lambda: None, name="lime-ended"), threading.Event()
    live = threading.Thread(target=stop.wait, name="lime-still-running", daemon=True)
    done.start()
    done.join()
    live.start()
    try:
        assert state.report() == ["thread 'lime-still-running' still running"]
    finally:
        stop.set()
        live.join()
    assert state.report() == []


def test_files_written_into_a_watched_folder_are_named(tmp_path, monkeypatch):
    monkeypatch.setattr(isolation, "ROOT", tmp_path)
    monkeypatch.setattr(isolation, "WATCHED", (tmp_path, tmp_path / "results"))
    (tmp_path / "kept.txt").write_text("there before")
    state = ProcessState.take()
    (tmp_path / "mlflow.db").write_text("")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "ray").mkdir()
    assert state.report() == ["new files in .: mlflow.db, results", "new files in results: ray"]


def test_what_is_left_is_one_warning_naming_the_test(tmp_path):
    home = os.getcwd()
    state = ProcessState.take()
    os.chdir(tmp_path)
    with pytest.warns(LeftBehind, match="^" + re.escape(f"t.py::x left behind: working directory {tmp_path}") + "$"):
        state.restore_and_report("t.py::x")
    assert os.getcwd() == home
