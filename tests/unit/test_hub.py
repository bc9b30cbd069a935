"""Which file of a hub repository a model argument names (hub.choose, hub.HubModel.parse): no network."""

import pytest

from llamaspec.errors import ConfigError, ModelError
from llamaspec.llama.hub import HubModel, choose, hub_spec

FILES = ["README.md", "model-Q4_K.gguf", "model-Q4_K_M.gguf", "model-q8_0.gguf", "mmproj-model-f16.gguf",
         "big-Q6_K-00001-of-00002.gguf", "big-Q6_K-00002-of-00002.gguf"]


@pytest.mark.parametrize("spec, chosen", [
    ("hf://o/r:Q4_K_M", ["model-Q4_K_M.gguf"]),
    ("hf://o/r:q4_k", ["model-Q4_K.gguf"]),  # never Q4_K_M
    ("hf://o/r:Q8_0", ["model-q8_0.gguf"]),
    ("hf://o/r", ["model-Q4_K_M.gguf"]),  # llama.cpp's default where there are several
    ("hf://o/r:Q6_K", ["big-Q6_K-00001-of-00002.gguf", "big-Q6_K-00002-of-00002.gguf"]),
    ("hf://o/r/model-q8_0.gguf", ["model-q8_0.gguf"]),
])
def test_a_tag_or_a_name_picks_the_file(spec, chosen):
    assert choose(HubModel.parse(spec), FILES) == chosen


@pytest.mark.parametrize("spec, files, fragment", [
    ("hf://o/r:F16", FILES, "o/r has no GGUF file for F16; its tags: Q4_K, Q4_K_M, Q8_0, Q6_K"),
    ("hf://o/r", ["a-Q8_0.gguf", "a-Q5_0.gguf"], "o/r has 2 models: give a tag, one of Q8_0, Q5_0"),
    ("hf://o/r", ["README.md", "mmproj-f16.gguf"], "o/r holds no GGUF model"),
    ("hf://o/r:Q6_K", FILES[:-1], "is the first of 2 parts, but big-Q6_K-00002-of-00002.gguf is missing"),
    ("hf://o/r/nope.gguf", FILES, "o/r has no file nope.gguf"),
])
def test_no_clear_file_is_one_line(spec, files, fragment):
    with pytest.raises(ModelError, match=fragment.replace("(", r"\(")):
        choose(HubModel.parse(spec), files)


def test_names():
    assert hub_spec("o/r:Q4_K_M") == "hf://o/r:Q4_K_M"
    assert hub_spec("o/r", "sub/m.gguf") == "hf://o/r/sub/m.gguf"
    for bad in ("o", "o/r:", "a b/c", "hf://"):
        with pytest.raises(ConfigError, match="OWNER/REPO"):
            HubModel.parse(bad)
    with pytest.raises(ConfigError, match="not both"):
        hub_spec("o/r:Q4_K_M", "m.gguf")
