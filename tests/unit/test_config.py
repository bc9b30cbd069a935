import pytest

from llamaspec import ConfigError, DraftConfig, GenerationConfig, ModelConfig, SamplingConfig
from llamaspec.config import endpoint


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top-p"),
    (dict(top_p=1.5), "top-p"),
    (dict(top_k=-1), "top-k"),
    (dict(min_p=2.0), "min-p"),
])
def test_sampling_ranges(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(draft_max=0), "draft-max"),
    (dict(draft_min=5, draft_max=4), "draft-min"),
    (dict(draft_p_min=1.5), "draft-p-min"),
])
def test_draft_ranges(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        DraftConfig(**kwargs)


def test_model_ranges():
    with pytest.raises(ConfigError, match="context"):
        ModelConfig("m.gguf", n_ctx=0)
    with pytest.raises(ConfigError, match="threads"):
        ModelConfig("m.gguf", n_threads=0)
    assert ModelConfig("m.gguf").threads >= 1


def test_valid_defaults():
    assert not SamplingConfig().greedy and SamplingConfig(temperature=0).greedy
    assert GenerationConfig().max_tokens == 256
    with pytest.raises(ConfigError):
        GenerationConfig(stop=("",))


def test_spec_parsing():
    from llamaspec import SpecConfig
    assert SpecConfig.parse("auto") == SpecConfig() and SpecConfig.parse("none").sources == frozenset()
    assert SpecConfig.parse("lookup, draft").sources == {"lookup", "draft"}
    for text in ("auto,lookup", "", " , "):
        with pytest.raises(ConfigError, match="--spec takes auto, none or"):
            SpecConfig.parse(text)

@pytest.mark.parametrize("server", ["localhost", "host:", ":50052", "host:0", "host:65536", "host:port", ""])
def test_an_rpc_server_is_host_and_port(server):
    with pytest.raises(ConfigError, match="HOST:PORT"):
        ModelConfig("m", rpc=(server,))


def test_rpc_placement():
    assert endpoint("10.0.0.2:50052") == ("10.0.0.2", 50052) and endpoint("[::1]:1") == ("::1", 1)
    assert ModelConfig("m", rpc=("h:1",)).offloaded == -1  # every layer there unless -ngl says
    assert ModelConfig("m", rpc=("h:1",), n_gpu_layers=12).offloaded == 12
    assert ModelConfig("m").offloaded == 0
    for split in [(-1.0, 1.0), (0.0, 0.0), (float("nan"),)]:
        with pytest.raises(ConfigError, match="tensor split"):
            ModelConfig("m", tensor_split=split)
    with pytest.raises(ConfigError, match="RPC timeout"):
        ModelConfig("m", rpc=("h:1",), rpc_timeout=0)
