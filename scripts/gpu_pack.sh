#!/usr/bin/env bash
# Prepare, on a machine with a network, everything scripts/gpu_check.sh needs on a GPU machine
# that has none (CUDA, CMake, ninja and Python 3.12 with numpy there, nothing else fetched):
#
#   bash scripts/gpu_pack.sh [DIR]       (default: .gpu in this checkout; ignored by git)
#
# DIR/llama-cpp-python.tar.xz   the installed llama-cpp-python's sdist, trimmed to what a CUDA
#                               build compiles (~5 MB instead of 77: no model vocabularies, docs,
#                               tools, tests or other backends' sources)
# DIR/wheels/                   llamaspec's dependencies that such a machine may lack, for PY
#                               (default 3.12) on manylinux x86-64
# DIR/models/NAME.partNN        each model of MODELS (default smollm2-135m-instruct), in parts of
#                               at most PART_MB (default 48) MiB, for machines that take files in
#                               small loads (gpu_check.sh joins and verifies them)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$here/.gpu}"
python=${PYTHON:-python}
py="${PY:-3.12}"
models="${MODELS:-smollm2-135m-instruct}"
part_mb="${PART_MB:-48}"
mkdir -p "$dir/wheels" "$dir/models"
grep -qx '/.gpu/' "$here/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >> "$here/.git/info/exclude"

# 1. The sources, trimmed.
version=$("$python" -c "import llama_cpp; print(llama_cpp.__version__)")
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$tmp" >&2
tar xzf "$tmp/llama_cpp_python-$version.tar.gz" -C "$tmp"
src="$tmp/llama_cpp_python-$version"
cpp="$src/vendor/llama.cpp"
rm -rf "$src/.git" "$src/.github" "$cpp/.git" "$cpp/.github" "$cpp/.devops" \
       "$src/docs" "$src/examples" "$src/tests" "$src/docker" \
       "$cpp/models" "$cpp/docs" "$cpp/media" "$cpp/examples" "$cpp/tests" "$cpp/benches" "$cpp/pocs" \
       "$cpp/gguf-py" "$cpp/conversion" "$cpp/scripts" "$cpp/skills" "$cpp/ci" "$cpp/app" "$cpp/requirements"
find "$cpp/tools" -mindepth 1 -maxdepth 1 ! -name mtmd -exec rm -rf {} +
for backend in "$cpp"/ggml/src/ggml-*/; do
    case "$(basename "$backend")" in ggml-cpu|ggml-cuda|ggml-blas|ggml-rpc) ;; *) rm -rf "$backend" ;; esac
done
# ggml's CMakeLists adds each backend it knows by name; the removed ones are never enabled, so
# only their directories' absence matters, which it does not check unless they are.
tar cJf "$dir/llama-cpp-python.tar.xz" -C "$tmp" "llama_cpp_python-$version"

# 2. Wheels of the pure-Python and binary dependencies a bare CUDA image lacks.
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dir/wheels" llguidance gguf prompt_toolkit wcwidth diskcache >&2

# 3. The models, in parts.
for name in $models; do
    path="$("$python" "$here/scripts/fetch_models.py" --quiet "$name")"
    rm -f "$dir/models/$(basename "$path").part"*
    split -b "${part_mb}M" -d -a 2 "$path" "$dir/models/$(basename "$path").part"
done
du -sh "$dir"/* "$dir"/models/* >&2
