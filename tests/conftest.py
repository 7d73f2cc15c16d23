import pytest


def pytest_sessionstart(session):
    """Under pytest-xdist (`-n N`), the controller fetches what every worker shares (llama.cpp's vocab
    files, the embedded default model) once, before the workers start, so that no two workers
    download or assemble the same file at once."""
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    from ramforge.store.resolve import default_model_path
    from tools.fetch_vocab import fetch_vocab

    fetch_vocab()
    default_model_path()


@pytest.fixture(scope="session")
def default_model():
    """Path of the embedded default model (gemma-3-270m Q4_K_M), assembled and verified once."""
    from ramforge.store.resolve import default_model_path

    return default_model_path()
