"""The unit tier: no model file, no network, fakes. A test here that asks for a model fails."""

import pytest


@pytest.fixture(scope="session")
def model_file():
    def refuse(name: str):
        raise AssertionError(f"a unit test asked for the model {name}: it belongs in tests/real")
    return refuse
