#!/usr/bin/env bash
# llamaspec on a machine with an NVIDIA GPU, checked in one command, from this checkout:
#
#   bash scripts/gpu_check.sh [build] [check]          (default: both)
#
# build: llama-cpp-python compiled for CUDA from its sources (flags: scripts/cmake_args.sh cuda)
#   into a wheel in $WORK/wheelhouse (one already there is reused), installed with llamaspec's
#   dependencies into $WORK/site, which this script puts first on PYTHONPATH.
# check: the model's cost curve, 1..32 rows, on the GPU (`llamaspec profile`), and what a change
#   of row count costs (scripts/gpu_graphs.py); `llamaspec bench`'s
#   five prompts, plain / lookup / draft / auto, on the GPU; tests/real/test_offload.py with every
#   layer offloaded (greedy text the GPU's own and the CPU's but at near-ties, the KV caches exact
#   after every step); the curve on the CPU; then one summary table (scripts/gpu_summary.py).
#
# With a network it downloads the sources, wheels and model itself. Without one, it takes them
# from $WORK as scripts/gpu_pack.sh left them: the sources trimmed to ~4 MB, the wheels, the model
# in parts (joined here; llamaspec verifies the whole file's sha256).
#
# WORK (default .gpu; a machine that gets its files in several loads may keep only what lies
# outside the checkout between them: then a folder there, e.g. WORK=/root/gw); OUT (default
# $WORK/out): costs.json (the curves), bench.json, and the logs with the summary in logs.tgz.
# MODEL (default smollm2-135m-instruct), DRAFT (default: MODEL: no smaller model shares its
# vocabulary, so it drafts for itself, at its own cost), N tokens per answer (256),
# REPEAT runs of each (3). CMAKE_EXTRA: more CMake flags (-DGGML_CUDA_FA=OFF leaves out the
# flash-attention kernels, a third of the build). BACKEND=cpu: a dry run on a machine without a GPU (built for its CPU,
# nothing offloaded). Exit status: 1 if a stage failed (the later ones still run).
set -uo pipefail
cd "$(dirname "$0")/.."
work="$(realpath -m "${WORK:-.gpu}")"
out="$(realpath -m "${OUT:-$work/out}")"
python="${PYTHON:-python3}"
model="${MODEL:-smollm2-135m-instruct}"
draft="${DRAFT:-$model}"
stages="${*:-build check}"
backend="${BACKEND:-cuda}"
mkdir -p "$work" "$out"
export PYTHONPATH="$work/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" LLAMASPEC_CACHE="$work/models" PYTHONUNBUFFERED=1
status=0

stage() {  # stage NAME COMMAND...: run, time, log to $out/NAME.log; a failure is remembered
    local name="$1" t0=$SECONDS
    shift
    echo "== $name" >&2
    if "$@" > "$out/$name.log" 2>&1; then
        echo "   ok in $((SECONDS - t0)) s" >&2
    else
        status=1
        echo "   FAILED in $((SECONDS - t0)) s; the end of $out/$name.log:" >&2
        tail -n 15 "$out/$name.log" >&2
    fi
}

compile() {
    if ls "$work"/wheelhouse/llama_cpp_python-*.whl > /dev/null 2>&1; then
        echo "reusing $(ls "$work"/wheelhouse/llama_cpp_python-*.whl)"
        return
    fi
    local src
    if [ -f "$work/llama-cpp-python.tar.xz" ]; then
        rm -rf "$work/src" && mkdir -p "$work/src" && tar xJf "$work/llama-cpp-python.tar.xz" -C "$work/src" || return 1
    else
        "$python" -m pip download --no-deps --no-binary :all: "llama-cpp-python==${LLAMA_CPP_PYTHON:-0.3.36}" \
            -d "$work/src" && tar xzf "$work"/src/llama_cpp_python-*.tar.gz -C "$work/src" || return 1
    fi
    src="$(ls -d "$work"/src/llama_cpp_python-*/ | head -n 1)"
    local isolation=""  # a machine with no network builds with the scikit-build-core it has
    "$python" -c "import scikit_build_core" 2> /dev/null && isolation="--no-build-isolation"
    [ "$backend" = cpu ] || nvcc --version | tail -n 2
    CMAKE_ARGS="$(sh scripts/cmake_args.sh "$backend") ${CMAKE_EXTRA:-}" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        "$python" -m pip wheel --verbose --no-deps $isolation -w "$work/wheelhouse" "$src"
}

install() {
    local wheels=(llguidance gguf prompt_toolkit wcwidth diskcache) offline=()
    if [ -d "$work/wheels" ]; then wheels=("$work"/wheels/*.whl); offline=(--no-index); fi
    "$python" -m pip install --quiet --no-deps --upgrade "${offline[@]}" --target "$work/site" \
        "$work"/wheelhouse/llama_cpp_python-*.whl "${wheels[@]}" &&
    "$python" -c "from llamaspec.llama.binding import gpus; print(gpus()); assert gpus() or '$backend' == 'cpu', 'no GPU'"
}

models() {  # join the parts gpu_pack.sh made, then let llamaspec fetch (verify) each model
    mkdir -p "$work/models"
    for first in "$work"/models/*.part00; do
        [ -e "$first" ] || continue
        whole="${first%.part00}"
        [ -f "$whole" ] || cat "${whole}".part* > "$whole" || return 1
    done
    "$python" scripts/fetch_models.py --quiet $model $draft
}

if [[ " $stages " == *" build "* ]]; then
    stage build compile
    stage install install
fi
if [[ " $stages " == *" check "* ]]; then
    # The C++ runtime libllama.so was linked with goes first: on an H100 image whose numpy (loaded
    # before libllama by llamaspec) brought another, the first model load crashed in std::regex.
    lib="$("$python" -c 'import llama_cpp.llama_cpp as ll; print(ll._base_path)' 2> /dev/null)/libllama.so"
    stdcxx="$(ldd "$lib" 2> /dev/null | awk '/libstdc\+\+/ {print $3; exit}')"
    [ -f "$stdcxx" ] && export LD_PRELOAD="$stdcxx${LD_PRELOAD:+ $LD_PRELOAD}"
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv > "$out/gpu.txt" 2>&1 ||
        echo "no nvidia-smi" > "$out/gpu.txt"
    stage models models
    stage profile_gpu "$python" -m llamaspec profile -m "$model" -ngl -1 --repeats 5
    stage graphs "$python" scripts/gpu_graphs.py "$model" -ngl -1 --json "$out/graphs.json"
    stage bench "$python" -m llamaspec bench -m "$model" -md "$draft" -ngl -1 -ngld -1 \
        --strategies plain,lookup,draft,auto -n "${N:-256}" --repeat "${REPEAT:-3}" --json "$out/bench.json"
    stage tests env LLAMASPEC_TEST_NGL=-1 LLAMASPEC_TEST_THREADS="$(nproc)" "$python" -m pytest -q -p no:cacheprovider tests/real/test_offload.py
    stage profile_cpu "$python" -m llamaspec profile -m "$model" -ngl 0 --repeats 2
    cp "$LLAMASPEC_CACHE/costs.json" "$out/costs.json" 2> /dev/null
    stage summary "$python" scripts/gpu_summary.py "$out"
    cat "$out/gpu.txt" "$out/summary.log"
    # the logs in one file: a device machine may give back no more than 8 files
    (cd "$out" && tar czf logs.tgz gpu.txt ./*.log && rm -f gpu.txt ./*.log)
fi
exit $status
