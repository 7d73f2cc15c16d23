import pytest


@pytest.fixture(scope="session")
def default_model():
    """Path of the embedded default model (gemma-3-270m Q4_K_M), assembled and verified once."""
    from ramforge.resolve import default_model_path

    return default_model_path()

