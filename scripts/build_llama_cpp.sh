#!/usr/bin/env bash
# Build llama.cpp's example programs from the llama.cpp sources vendored in the sdist of the
# installed llama-cpp-python, so that llama.cpp's programs and llamaspec run the same llama.cpp.
#
#   bash scripts/build_llama_cpp.sh [OUT_DIR]      (prints the directory holding the programs)
#
# OUT_DIR defaults to ~/.cache/llamaspec/llama.cpp-VERSION, where `llamaspec compare` and the tests
# find the programs. TARGETS chooses the programs (default: every one `llamaspec compare` and the
# tests run, and rpc-server, built ggml-rpc-server); the flags come from scripts/cmake_args.sh (the
# CPU's, the RPC backend), as for llama-cpp-python; extra CMake flags come from CMAKE_ARGS (e.g.
# CMAKE_ARGS="-DGGML_CUDA=on").
# llama.cpp's HTTP server is left out unless TARGETS names llama-server, which turns its build on
# (it is a long compile that `llamaspec compare` and the tests do not need):
#
#   TARGETS=llama-server bash scripts/build_llama_cpp.sh     (then: OUT_DIR/build/bin/llama-server)
#
# Takes about 5 minutes on 2 cores (a rebuild with nothing changed: seconds).
set -euo pipefail
python=${PYTHON:-python}
version=$("$python" -c "import llama_cpp; print(llama_cpp.__version__)")
out="${1:-$HOME/.cache/llamaspec/llama.cpp-$version}"
src="$out/src"
mkdir -p "$src"
sdist="$src/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
    "$python" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$src" >&2
fi
tree="$src/llama_cpp_python-$version/vendor/llama.cpp"
[ -d "$tree" ] || tar xzf "$sdist" -C "$src"
flags="$(sh "$(dirname "$0")/cmake_args.sh" | sed 's/-DLLAVA_BUILD=OFF//')"  # llava: llama-cpp-python's flag
targets="${TARGETS:-llama-simple llama-speculative-simple llama-lookup llama-lookup-create llama-lookup-stats llama-lookahead llama-completion llama-bench llama-gguf-split ggml-rpc-server}"
server=OFF
case " $targets " in *" llama-server "*) server=ON ;; esac
# shellcheck disable=SC2086
cmake -S "$tree" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=$server -DLLAMA_OPENSSL=OFF $flags ${CMAKE_ARGS:-} >&2
# shellcheck disable=SC2086
cmake --build "$out/build" --config Release -j "$(nproc 2>/dev/null || echo 2)" --target $targets >&2
echo "$out/build/bin"
