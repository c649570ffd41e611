#!/usr/bin/env bash
# llama.cpp for bench/vs_llama_cpp.py, from the llama.cpp source that the PyPI sdist of llama-cpp-python vendors
# (only package registries need be reachable: no GitHub).
#
#   bench/setup_llama_cpp.sh [--no-venv]
#
# 1. bench/.llama-cpp/bin/: llama-batched-bench and llama-bench, built with cmake from the sdist's
#    vendor/llama.cpp: CPU only, Release, -DGGML_NATIVE=ON, static (no shared libraries to find at run time).
#    llama-server is left out: on a two-core machine it is most of the build's time, and the bench does not use it.
# 2. bench/.venv-llamacpp/: llama-cpp-python built from the same sdist by pip (python3.11 -m venv, --no-binary,
#    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF": mtmd, the multimodal library, is imported only for image
#    chats), for the bench's per-token decode timing through the Python API.
#
# Each step is skipped when already built for the same version (bench/.llama-cpp/VERSION, llama_cpp.__version__).
# LLAMA_CPP_PYTHON_VERSION picks another version; JOBS the build's parallelism (default: nproc).
set -euo pipefail

VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
JOBS=${JOBS:-$(nproc)}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
DEST=$HERE/.llama-cpp
VENV=$HERE/.venv-llamacpp
PIP=${PIP:-$ROOT/.venv/bin/pip}
SDIST=$DEST/src/llama_cpp_python-$VERSION.tar.gz

fetch_sdist() {
    if [ ! -f "$SDIST" ]; then
        mkdir -p "$DEST/src"
        "$PIP" download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$DEST/src"
    fi
}

if [ -x "$DEST/bin/llama-batched-bench" ] && [ "$(cat "$DEST/VERSION" 2>/dev/null)" = "$VERSION" ]; then
    echo "llama.cpp tools of llama-cpp-python $VERSION already built in $DEST/bin"
else
    fetch_sdist
    rm -rf "$DEST/src/llama_cpp_python-$VERSION" "$DEST/build" "$DEST/bin" "$DEST/VERSION"
    tar -xzf "$SDIST" -C "$DEST/src"
    cmake -S "$DEST/src/llama_cpp_python-$VERSION/vendor/llama.cpp" -B "$DEST/build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
        -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_OPENSSL=OFF
    cmake --build "$DEST/build" -j "$JOBS" --target llama-batched-bench llama-bench
    mkdir -p "$DEST/bin"
    cp "$DEST/build/bin/llama-batched-bench" "$DEST/build/bin/llama-bench" "$DEST/bin/"
    echo "$VERSION" >"$DEST/VERSION"
    echo "built $DEST/bin/llama-batched-bench and llama-bench (llama-cpp-python $VERSION's llama.cpp)"
fi

if [ "${1:-}" = "--no-venv" ]; then
    exit 0
fi
if [ -x "$VENV/bin/python" ] && [ "$("$VENV/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null)" = "$VERSION" ]; then
    echo "llama-cpp-python $VERSION already installed in $VENV"
else
    fetch_sdist
    rm -rf "$VENV"
    python3.11 -m venv "$VENV"
    # --find-links: the sdist downloaded above (the same file the index serves); its dependencies from the index.
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS \
        "$VENV/bin/pip" install --no-binary llama-cpp-python --find-links "$DEST/src" "llama-cpp-python==$VERSION"
    echo "installed llama-cpp-python $VERSION in $VENV"
fi
