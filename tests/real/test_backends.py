"""Which backend a model runs on, what its costs are cached under, and the CMake flags that build
llama.cpp for a backend: with fakes where a GPU would be needed (scripts/gpu_check.sh checks the
real thing on a GPU machine)."""

from __future__ import annotations



from llamaspec.llama import binding
from llamaspec.llama.binding import Context, Device, Model, backend_name
from llamaspec.planning import costs
from llamaspec.planning.costs import REFERENCE_CPU, CostCurve, plausible_draft

from conftest import QWEN, QWEN_DRAFT, SMOL, THREADS

H100 = Device("CUDA0", "NVIDIA H100 80GB HBM3", "gpu")


def test_costs_are_cached_per_backend_and_offload(model_file, monkeypatch, tmp_path):
    """A curve measured on a (fake) GPU with every layer offloaded is found again for that
    offload, not for the CPU nor for a partial offload, which have curves of their own."""
    monkeypatch.setattr(binding, "gpus", lambda: [H100])
    path = model_file(SMOL)
    model = Model(path, n_gpu_layers=-1)  # this build has no GPU: the layers stay on the CPU
    cache = tmp_path / "costs.json"
    ctx = Context(model, 512, THREADS)
    try:
        assert backend_name(model) == "CUDA0 (all layers)"
        flat = CostCurve([1.0, 1.1] + [1.2] * 30, 2.0, THREADS, backend_name(model))
        costs.save(flat, ctx, cache)
        assert costs.load_or_measure(ctx, cache) == flat  # found: nothing measured
        assert costs.cached_curve(path, THREADS, cache, "cpu") is None
        assert costs.cached_curve(path, THREADS, cache, "CUDA0 (12 of 31 layers)") is None
        assert costs.cached_curve(path, THREADS, cache, "CUDA0 (all layers)") == flat
    finally:
        ctx.close()
        model.close()


def test_a_draft_as_dear_as_its_target_is_plausible_on_a_gpu_only(model_file, pool):
    """On the CPU a smaller draft measured slower than its target was measured on a busy machine;
    on a GPU both decodes are bound by kernel launches, and a draft may cost what its target does."""
    target, draft = pool.get(model_file(QWEN)), pool.get(model_file(QWEN_DRAFT))
    try:
        for backend, plausible in (("cpu", False), ("CUDA0 (all layers)", True)):
            t = CostCurve(REFERENCE_CPU.relative, 3.0, THREADS, backend)
            d = CostCurve(REFERENCE_CPU.relative, 3.1, THREADS, backend)
            assert plausible_draft(d, draft, t, target) is plausible
    finally:
        pool.release(target)
        pool.release(draft)
