#!/usr/bin/env sh
# Print the CMake flags this CPU needs when llama.cpp is built for it (empty on most machines).
#
#   CMAKE_ARGS="$(sh scripts/cpu_cmake_args.sh)" pip install .
#
# On Intel CPUs with AMX (Sapphire Rapids and later), a native build of llama.cpp multiplies
# Q4_K weights with its AMX kernels and crashes in the first decode (llama.cpp issue 20824).
# Building without AMX keeps every other native instruction (AVX-512, VNNI) and llama.cpp's
# weight repacking. Used by .ci/run and scripts/build_llama_cpp.sh, so that llama-cpp-python
# and llama.cpp's programs are built alike.
if [ "$(uname -m)" = x86_64 ] && grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
    echo "-DCMAKE_C_FLAGS=-mno-amx-int8 -DCMAKE_CXX_FLAGS=-mno-amx-int8"
fi
