import ctypes

import numpy as np
import pytest
from scipy.stats import chisquare

from llamaspec.config import SamplingConfig
from llamaspec.errors import ConfigError
from llamaspec.sampling import Distribution, Mirostat, sample, shape, transform


def cfg(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, **shaping):
    return SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, **shaping)


def as_dict(dist):
    return {int(i): float(p) for i, p in zip(dist.ids, dist.probs)}


def softmax(x):
    e = np.exp(np.asarray(x, dtype=np.float64) - np.max(x))
    return e / e.sum()


# Token probabilities 0.4, 0.3, 0.2, 0.1 at temperature 1, in scrambled positions.
PROBS = np.array([0.2, 0.4, 0.1, 0.3])
LOGITS = np.log(PROBS).astype(np.float32)


def test_distribution_point_and_prob():
    d = Distribution.point(7)
    assert d.prob(7) == 1.0 and d.prob(3) == 0.0
    d = Distribution(np.array([4, 9]), np.array([0.25, 0.75]))
    assert d.prob(9) == 0.75 and d.prob(4) == 0.25 and d.prob(5) == 0.0


def test_no_filters_is_softmax():
    d = as_dict(transform(LOGITS, cfg()))
    assert d.keys() == {0, 1, 2, 3}
    assert np.allclose([d[i] for i in range(4)], PROBS)


def test_top_k():
    logits = np.array([1, 5, 3, 4, 2], dtype=np.float32)
    d = as_dict(transform(logits, cfg(top_k=2)))
    assert d.keys() == {1, 3}
    assert np.allclose([d[1], d[3]], softmax([5, 4]))
    assert as_dict(transform(logits, cfg(top_k=10))).keys() == {0, 1, 2, 3, 4}


@pytest.mark.parametrize("top_p, kept", [(0.35, {1}), (0.65, {1, 3}), (0.85, {1, 3, 0}), (0.95, {0, 1, 2, 3})])
def test_top_p(top_p, kept):
    d = as_dict(transform(LOGITS, cfg(top_p=top_p)))
    assert d.keys() == kept
    expected = PROBS[sorted(kept)] / PROBS[sorted(kept)].sum()
    assert np.allclose([d[i] for i in sorted(kept)], expected)


def test_top_p_normalises_over_top_k_survivors():
    # After top-k 2 the candidates have probabilities 4/7 and 3/7, so top-p 0.5 keeps one.
    assert as_dict(transform(LOGITS, cfg(top_k=2, top_p=0.5))).keys() == {1}
    assert as_dict(transform(LOGITS, cfg(top_p=0.5))).keys() == {1, 3}


@pytest.mark.parametrize("min_p, kept", [(0.2, {0, 1, 2, 3}), (0.3, {0, 1, 3}), (0.6, {1, 3}), (0.8, {1}), (1.0, {1})])
def test_min_p(min_p, kept):
    # min-p keeps p_i >= min_p * 0.4.
    d = as_dict(transform(LOGITS, cfg(min_p=min_p)))
    assert d.keys() == kept
    assert np.allclose([d[i] for i in sorted(kept)], PROBS[sorted(kept)] / PROBS[sorted(kept)].sum())


def test_top_p_uses_probabilities_before_min_p():
    # min-p 0.6 keeps 0.4 and 0.3. Top-p 0.55 runs first, over all four: cumulative
    # 0.4 < 0.55 <= 0.7, so it keeps two. Normalising over min-p's survivors instead
    # (4/7 >= 0.55) would wrongly keep one.
    assert as_dict(transform(LOGITS, cfg(top_p=0.55, min_p=0.6))).keys() == {1, 3}
    # And the shorter of the two prefixes wins.
    assert as_dict(transform(LOGITS, cfg(top_p=0.35, min_p=0.6))).keys() == {1}
    assert as_dict(transform(LOGITS, cfg(top_p=0.95, min_p=0.6))).keys() == {1, 3}


def test_temperature():
    logits = np.array([0, 1, 2], dtype=np.float32)
    d = as_dict(transform(logits, cfg(temperature=0.5)))
    assert np.allclose([d[0], d[1], d[2]], softmax([0, 2, 4]))
    d = as_dict(transform(logits, cfg(temperature=2.0)))
    assert np.allclose([d[0], d[1], d[2]], softmax([0, 0.5, 1]))


def test_filters_apply_before_temperature():
    # At temperature 1 the probabilities are 0.4/0.3/0.2/0.1, so min-p 0.6 keeps two;
    # a high temperature flattens the kept ones but must not let more through.
    d = as_dict(transform(LOGITS, cfg(temperature=5.0, min_p=0.6, top_p=0.9)))
    assert d.keys() == {1, 3}
    assert np.allclose([d[1], d[3]], softmax(np.log([0.4, 0.3]) / 5.0))


def test_greedy_is_point_mass_on_first_argmax():
    logits = np.array([1, 3, 0, 3], dtype=np.float32)
    d = transform(logits, cfg(temperature=0.0, top_k=1, top_p=0.1, min_p=0.9))
    assert as_dict(d) == {1: 1.0}


@pytest.mark.parametrize(
    "c", [cfg(), cfg(top_k=40), cfg(top_k=40, top_p=0.9, min_p=0.05, temperature=0.7),
          cfg(top_p=0.8), cfg(min_p=0.1), cfg(temperature=0.0)])
def test_does_not_modify_logits(c):
    logits = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    before = logits.copy()
    logits.setflags(write=False)  # any in-place write raises
    d = transform(logits, c)
    assert np.array_equal(logits, before)
    assert d.ids.dtype == np.int64 and d.probs.dtype == np.float64
    assert abs(d.probs.sum() - 1) < 1e-12


def test_sample_follows_distribution():
    d = Distribution(np.array([10, 20, 30, 40]), np.array([0.1, 0.0, 0.6, 0.3]))
    rng = np.random.default_rng(1)
    draws = np.array([sample(d, rng) for _ in range(20000)])
    counts = np.array([(draws == t).sum() for t in (10, 20, 30, 40)])
    assert counts[1] == 0
    assert chisquare(counts[[0, 2, 3]], 20000 * d.probs[[0, 2, 3]]).pvalue > 1e-3
    assert sample(Distribution.point(5), rng) == 5


# --- comparison with llama.cpp's own sampler chain -----------------------------------


def llama_cpp_chain(logits, c):
    """Surviving token ids and their final logits after llama.cpp's top-k, top-p, min-p, temp."""
    lc = pytest.importorskip("llama_cpp.llama_cpp")
    data = (lc.llama_token_data * len(logits))()
    for i, x in enumerate(logits):
        data[i].id, data[i].logit, data[i].p = i, float(x), 0.0
    cur = lc.llama_token_data_array(data=ctypes.cast(data, lc.llama_token_data_p),
                                    size=len(logits), selected=-1, sorted=False)
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    try:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(c.top_k))
        if c.typical_p < 1:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_typical(c.typical_p, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(c.top_p, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_min_p(c.min_p, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(c.temperature))
        lc.llama_sampler_apply(chain, ctypes.byref(cur))
        out = [(cur.data[i].id, cur.data[i].logit) for i in range(cur.size)]
    finally:
        lc.llama_sampler_free(chain)  # frees the samplers added to it too
    ids = np.array([t for t, _ in out], dtype=np.int64)
    return ids, np.array([x for _, x in out], dtype=np.float64)


CONFIGS = [
    cfg(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),  # llama.cpp's defaults
    cfg(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    cfg(temperature=1.0, top_k=100, top_p=1.0, min_p=0.0),
    cfg(temperature=0.5, top_k=0, top_p=0.9, min_p=0.0),
    cfg(temperature=1.3, top_k=0, top_p=1.0, min_p=0.1),
    cfg(temperature=0.7, top_k=0, top_p=0.8, min_p=0.02),
    cfg(temperature=0.7, top_k=0, top_p=0.3, min_p=0.01),
    cfg(temperature=1.0, top_k=20, top_p=0.5, min_p=0.2),
    cfg(temperature=2.0, top_k=500, top_p=0.99, min_p=0.001),
    cfg(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, typical_p=0.5),
    cfg(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=0.9),
    cfg(temperature=0.7, top_k=0, top_p=0.8, min_p=0.02, typical_p=0.3),
]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("c", CONFIGS,
                         ids=lambda c: f"T{c.temperature}-k{c.top_k}-p{c.top_p}-m{c.min_p}-y{c.typical_p}")
def test_matches_llama_cpp(c, seed):
    rng = np.random.default_rng(seed)
    n_vocab = [3000, 5000, 32000, 1500][seed]  # > 1024 exercises llama.cpp's partial-sort path
    logits = (rng.normal(size=n_vocab) * rng.uniform(1, 4)).astype(np.float32)
    ref_ids, ref_logits = llama_cpp_chain(logits, c)
    ours = transform(logits, c)
    assert set(ours.ids.tolist()) == set(ref_ids.tolist())
    ref = dict(zip(ref_ids.tolist(), softmax(ref_logits)))
    assert np.allclose(ours.probs, [ref[t] for t in ours.ids.tolist()], rtol=0, atol=1e-5)


# --- penalties and logit biases, against llama.cpp's own samplers ---------------------------


def llama_cpp_shaped(logits, c, text):
    """The logits after llama.cpp's logit-bias and penalties samplers, the text accepted first."""
    lc = pytest.importorskip("llama_cpp.llama_cpp")
    n = len(logits)
    data = (lc.llama_token_data * n)()
    for i, x in enumerate(logits):
        data[i].id, data[i].logit, data[i].p = i, float(x), 0.0
    cur = lc.llama_token_data_array(data=ctypes.cast(data, lc.llama_token_data_p), size=n, selected=-1, sorted=False)
    biases = (lc.llama_logit_bias * max(len(c.logit_bias), 1))(*[lc.llama_logit_bias(t, b) for t, b in c.logit_bias])
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    try:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_logit_bias(n, len(c.logit_bias), biases))
        last_n = len(text) if c.penalty_last_n < 0 else c.penalty_last_n  # llama.cpp's programs: -1 is the context
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_penalties(n, last_n, c.repeat_penalty,
                                                                          c.frequency_penalty, c.presence_penalty))
        for token in text:
            lc.llama_sampler_accept(chain, token)
        lc.llama_sampler_apply(chain, ctypes.byref(cur))
        out = np.empty(n, dtype=np.float32)
        for i in range(cur.size):
            out[cur.data[i].id] = cur.data[i].logit
    finally:
        lc.llama_sampler_free(chain)
    return out


SHAPES = [
    cfg(temperature=0, repeat_penalty=1.3),
    cfg(temperature=0.8, repeat_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.2, penalty_last_n=16),
    cfg(temperature=0, repeat_penalty=0.8, presence_penalty=-0.5, penalty_last_n=-1, logit_bias=((3, 2.5), (7, -1.25))),
    cfg(temperature=1, frequency_penalty=1.0, penalty_last_n=0, logit_bias=((5, float("-inf")),)),
]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("c", SHAPES, ids=range(len(SHAPES)))
def test_penalties_and_biases_match_llama_cpp(c, seed):
    """The same float32 logits as llama.cpp's samplers after the same text (repeats, tokens seen
    once, tokens outside the window, negative and positive logits)."""
    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=200) * 3).astype(np.float32)
    text = [int(t) for t in rng.integers(0, 40, 80)]
    ours = shape(logits, c, text)
    assert np.array_equal(ours, llama_cpp_shaped(logits, c, text))
    assert c.shaped == (not np.array_equal(ours, logits))


def test_shaping_nothing_is_the_row_itself():
    logits = np.arange(5, dtype=np.float32)
    assert shape(logits, cfg(), [1, 2, 2]) is logits
    assert shape(logits, cfg(repeat_penalty=1.5, penalty_last_n=0), [1, 2]) is logits


@pytest.mark.parametrize("bad, message", [
    (dict(repeat_penalty=0), "repeat penalty must be a finite number > 0"),
    (dict(frequency_penalty=float("nan")), "frequency and presence penalties must be finite"),
    (dict(penalty_last_n=-2), "penalty window"),
    (dict(logit_bias=((3, float("inf")),)), "token 3's logit bias must be a number or -inf"),
    (dict(logit_bias=((-1, 1.0),)), "a logit bias's token must be a token id"),
])
def test_bad_penalties_are_one_line_errors(bad, message):
    with pytest.raises(ConfigError, match=message):
        SamplingConfig(**bad)


@pytest.mark.parametrize("seed", range(4))
def test_greedy_with_typical_p_takes_the_best_token_typical_p_keeps(seed):
    """llama.cpp's temperature 0 after typical-p: the best of the tokens it keeps, which need not
    be the best token (a peaked row's favourite is far less surprising than its entropy)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=3000).astype(np.float32)
    logits[7] += 7  # the favourite (p ~ 0.2): its surprise is far below the entropy of the rest
    c = cfg(temperature=1.0, typical_p=0.2)
    ids, _ = llama_cpp_chain(logits, c)
    greedy = transform(logits, cfg(temperature=0, typical_p=0.2))
    assert greedy.ids.tolist() == [max(ids.tolist(), key=lambda t: logits[t])]
    assert 7 not in ids.tolist() and int(np.argmax(logits)) == 7


# --- mirostat, against llama.cpp's own samplers ----------------------------------------------


def llama_cpp_mirostat(rows, c, seed):
    """For each row in turn, llama.cpp's temperature then mirostat sampler (one chain, so mu goes
    on from row to row): the tokens it kept with their probabilities, and the token it drew."""
    lc = pytest.importorskip("llama_cpp.llama_cpp")
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    out = []
    try:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(c.temperature))
        n = rows.shape[1]
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_mirostat(n, seed, c.mirostat_tau, c.mirostat_eta, 100)
                                   if c.mirostat == 1 else
                                   lc.llama_sampler_init_mirostat_v2(seed, c.mirostat_tau, c.mirostat_eta))
        for logits in rows:
            data = (lc.llama_token_data * n)()
            for i, x in enumerate(logits):
                data[i].id, data[i].logit, data[i].p = i, float(x), 0.0
            cur = lc.llama_token_data_array(data=ctypes.cast(data, lc.llama_token_data_p), size=n, selected=-1,
                                            sorted=False)
            lc.llama_sampler_apply(chain, ctypes.byref(cur))
            kept = {cur.data[i].id: cur.data[i].p for i in range(cur.size)}
            token = cur.data[cur.selected].id
            lc.llama_sampler_accept(chain, token)
            out.append((kept, token))
    finally:
        lc.llama_sampler_free(chain)
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("c", [cfg(temperature=1.0, mirostat=2), cfg(temperature=0.7, mirostat=2, mirostat_tau=3.0),
                               cfg(temperature=1.0, mirostat=1), cfg(temperature=1.5, mirostat=1, mirostat_tau=4.0,
                                                                    mirostat_eta=0.3)],
                         ids=["v2", "v2-T0.7-tau3", "v1", "v1-T1.5-tau4-eta0.3"])
def test_mirostat_matches_llama_cpp_along_a_text(c, seed):
    """The tokens kept and their probabilities at every position of a 40-token text, mu carried
    from each drawn token to the next position as llama.cpp's sampler carries it."""
    rng = np.random.default_rng(seed)
    rows = (rng.normal(size=(40, 3000)) * rng.uniform(1.5, 4, size=(40, 1))).astype(np.float32)
    state = Mirostat.start(c)
    sizes = set()
    for logits, (kept, token) in zip(rows, llama_cpp_mirostat(rows, c, seed)):
        dist = state.distribution(logits)
        assert as_dict(dist).keys() == kept.keys()
        assert all(abs(p - kept[t]) < 1e-5 for t, p in as_dict(dist).items())
        state.advance(dist, token)
        sizes.add(len(kept))
    assert len(sizes) > 5  # mu moved, and the kept sets with it


def test_mirostat_needs_a_temperature_and_a_version():
    assert Mirostat.start(cfg(temperature=0, mirostat=2)) is None  # greedy: the best token, as llama.cpp's temp 0
    assert Mirostat.start(cfg(temperature=1.0)) is None
    assert Mirostat.start(cfg(temperature=1.0, mirostat=1, mirostat_tau=3.0)).mu == 6.0
    with pytest.raises(ConfigError, match="mirostat is 0 \\(off\\), 1 or 2"):
        SamplingConfig(mirostat=3)
