#!/usr/bin/env sh
# Print the CMake flags that build llama.cpp for this machine and a backend, for llama-cpp-python
# (its CMAKE_ARGS) and for llama.cpp's programs (scripts/build_llama_cpp.sh):
#
#   CMAKE_ARGS="$(sh scripts/cmake_args.sh cuda)" pip install --force-reinstall --no-cache-dir llama-cpp-python
#
# cpu (default): this CPU's own flags (scripts/cpu_cmake_args.sh: empty on most machines).
# cuda: and CUDA, compiled for the compute capability of the GPUs that nvidia-smi lists (90 on
#   an H100 or H200): one architecture compiles in minutes, llama.cpp's default list of them takes
#   far longer; "native" where nvidia-smi does not answer (CMake then asks the GPU itself).
# metal: and Metal (Apple GPUs; llama-cpp-python turns it on by itself on Apple machines).
# Every backend: llama.cpp's RPC backend (a model's layers on rpc-server processes, --rpc), and
# no llava/mtmd library, which llamaspec does not use.
# pip keeps a wheel it built by version, whatever the flags: `pip cache remove llama_cpp_python`
# before a build with other flags, or --force-reinstall --no-cache-dir as above.
set -eu
here="$(dirname "$0")"
flags="-DLLAVA_BUILD=OFF -DGGML_RPC=ON $(sh "$here/cpu_cmake_args.sh")"
case "${1:-cpu}" in
    cpu) ;;
    cuda)
        archs=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | grep -E '^[0-9]+$' \
                | sort -u | paste -sd ';' - || true)
        flags="$flags -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${archs:-native}" ;;
    metal) flags="$flags -DGGML_METAL=on" ;;
    *) echo "usage: sh scripts/cmake_args.sh [cpu|cuda|metal]" >&2; exit 2 ;;
esac
echo "$flags" | sed 's/  */ /g; s/ $//'
