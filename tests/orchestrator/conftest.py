import pytest


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch):
    """A private sqlite MLflow store per test (never the user's mlflow.db)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("LIME_CACHE", str(tmp_path / "cache"))
    return uri
