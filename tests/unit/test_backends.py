"""Which backend a model runs on, what its costs are cached under, and the CMake flags that build
llama.cpp for a backend: with fakes where a GPU would be needed (scripts/gpu_check.sh checks the
real thing on a GPU machine)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from llamaspec.llama import binding
from llamaspec.llama.binding import Device, backend_name, devices, offload_name

from conftest import ROOT


SCRIPTS = ROOT / "scripts"
H100 = Device("CUDA0", "NVIDIA H100 80GB HBM3", "gpu")


def test_this_build_lists_its_cpu_among_its_devices():
    assert any(d.kind == "cpu" and d.name == "CPU" and d.description for d in devices())


@pytest.mark.parametrize("names, ngl, expected", [
    ([], -1, "cpu"),  # a build without a GPU, or none found: offloading is ignored
    (["CUDA0"], 0, "cpu"),
    (["CUDA0"], -1, "CUDA0 (all layers)"),
    (["CUDA0"], 31, "CUDA0 (all layers)"),  # 30 layers and the output layer
    (["CUDA0"], 30, "CUDA0 (30 of 31 layers)"),  # the output layer stays on the CPU
    (["CUDA0"], 12, "CUDA0 (12 of 31 layers)"),
    (["CUDA0", "CUDA1"], 99, "CUDA0+CUDA1 (all layers)"),
])
def test_a_backend_is_named_by_its_gpus_and_the_layers_they_hold(names, ngl, expected):
    assert offload_name(names, ngl, 30) == expected


def test_a_placement_on_rpc_servers_is_named_by_the_servers_first_and_the_split(monkeypatch):
    from types import SimpleNamespace
    placed = SimpleNamespace(rpc=("10.0.0.2:50052", "10.0.0.3:50052"), n_gpu_layers=-1, n_layer=28, tensor_split=())
    monkeypatch.setattr(binding, "gpus", lambda: [H100])
    assert backend_name(placed) == "RPC[10.0.0.2:50052]+RPC[10.0.0.3:50052]+CUDA0 (all layers)"
    placed.tensor_split, placed.n_gpu_layers = (3.0, 1.0, 0.5), 12
    assert backend_name(placed) == "RPC[10.0.0.2:50052]+RPC[10.0.0.3:50052]+CUDA0 (12 of 29 layers, split 3,1,0.5)"
    monkeypatch.setattr(binding, "gpus", lambda: [])
    placed.tensor_split = ()
    assert backend_name(placed) == "RPC[10.0.0.2:50052]+RPC[10.0.0.3:50052] (12 of 29 layers)"


def _cmake_args(tmp_path: Path, *args: str, smi: str = None) -> subprocess.CompletedProcess:
    """scripts/cmake_args.sh with a fake nvidia-smi printing ``smi`` (None: one that fails)."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    script = fake / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + (f"printf '{smi}'\n" if smi is not None else "exit 9\n"))
    script.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["sh", str(SCRIPTS / "cmake_args.sh"), *args], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("smi, archs", [("9.0\\n", "90"), ("8.6\\n9.0\\n9.0\\n", "86;90"), (None, "native"),
                                        ("No devices were found\\n", "native")])
def test_cuda_flags_name_the_gpus_compute_capabilities(tmp_path, smi, archs):
    result = _cmake_args(tmp_path, "cuda", smi=smi)
    assert result.returncode == 0, result.stderr
    cpu = _cmake_args(tmp_path).stdout.strip()
    assert result.stdout.strip() == f"{cpu} -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES={archs}"


def test_cpu_and_metal_flags_and_a_wrong_backend(tmp_path):
    cpu = _cmake_args(tmp_path).stdout.strip()
    assert cpu.startswith("-DLLAVA_BUILD=OFF -DGGML_RPC=ON") and "CUDA" not in cpu  # every build: --rpc works
    assert _cmake_args(tmp_path, "metal").stdout.strip() == f"{cpu} -DGGML_METAL=on"
    wrong = _cmake_args(tmp_path, "rocm")
    assert wrong.returncode == 2 and wrong.stderr.strip() == "usage: sh scripts/cmake_args.sh [cpu|cuda|metal]"
