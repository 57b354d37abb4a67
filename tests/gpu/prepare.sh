#!/bin/sh
# tests/gpu/prepare.sh [FOLDER] - on a development machine (no GPU needed), builds everything the
# GPU run needs into FOLDER (default ./gpu-pack, ignored by git), for tests/gpu/run.sh on a GPU
# machine that has the NVIDIA driver and CUDA but no autotools, compiler, Check or network:
#
#   FOLDER/bin/             backplane, test-cuda, test-cuda-load, bench-matmul, bench-ops
#   FOLDER/lib/             libbackplane and every other library they need that such a machine
#                           lacks (libsubunit, ...): not glibc, not the CUDA libraries
#   FOLDER/plugins/         the CPU, meta and CUDA plugins (with NCCL, when this toolkit has it)
#   FOLDER/plugins-nonccl/  the CUDA plugin again, built --without-nccl, for a machine whose
#                           CUDA has no NCCL
#   FOLDER/BUILD-INFO       what was built, from which commit, with which toolkit
#
# Nothing in FOLDER refers to the build directory: the build happens in a temporary directory
# that is deleted at the end, the programs are the real executables (not libtool wrappers), and
# run.sh gives every path through the environment (LD_LIBRARY_PATH, BP_PLUGIN_PATH,
# BP_TEST_*_PLUGIN_DIR). Stripped, the folder stays under the 64 MiB a `carry` may take.
#
# Environment: BP_GPU_ARCH (default sm_90), JOBS (default 2), CUDA_HOME (default: configure's).
set -eu

top=$(cd "$(dirname "$0")/../.." && pwd)
pack=${1:-$top/gpu-pack}
arch=${BP_GPU_ARCH:-sm_90}
jobs=${JOBS:-2}
limit=$((64 * 1024 * 1024))
start=$(date +%s)

say() { echo "gpu/prepare.sh: $*"; }
die() { say "$*" >&2; exit 1; }

case "$pack" in /*) ;; *) pack=$(pwd)/$pack ;; esac
build=$(mktemp -d "${TMPDIR:-/tmp}/bp-gpu-build.XXXXXX")
trap 'rm -rf "$build"' EXIT INT TERM

if [ ! -x "$top/configure" ]; then
    (cd "$top" && ./bootstrap) > "$build/bootstrap.log" 2>&1 ||
        { tail -20 "$build/bootstrap.log"; die "bootstrap failed (autoconf, automake, libtool?)"; }
fi

# One build with NCCL (as the toolkit allows), one of the CUDA plugin alone without it.
mkdir -p "$build/main" "$build/nonccl"
# Installed under a prefix that exists nowhere (the programs get every path from run.sh).
dirs="--prefix=/opt/backplane-gpu --libdir=/opt/backplane-gpu/lib --with-plugindir=/opt/backplane-gpu/plugins"
(cd "$build/main" && "$top/configure" $dirs --with-cuda --with-cuda-arch="$arch" \
    > configure.log 2>&1) ||
    { tail -20 "$build/main/configure.log"; die "configure failed"; }
grep -q '^CUDA_LIBS = .*-lcudart' "$build/main/Makefile" ||
    die "configure did not enable the CUDA plugin"
say "building for $arch with $jobs jobs in $build"
# Installed copies of the library, tool and plugins: libtool relinks them without the build
# tree's run path. The benchmarks are built without their built-in plugin directories.
(cd "$build/main" && make -j"$jobs" BENCH_PLUGIN_DIRS= > make.log 2>&1 &&
    make -j"$jobs" tests/test-cuda tests/test-cuda-load >> make.log 2>&1 &&
    make install DESTDIR="$build/inst" >> make.log 2>&1) ||
    { tail -30 "$build/main/make.log"; die "build failed"; }
(cd "$build/nonccl" && "$top/configure" $dirs --with-cuda --with-cuda-arch="$arch" --without-nccl \
    > configure.log 2>&1 &&
    make -j"$jobs" libbackplane.la plugins/cuda/backplane-cuda.la \
        plugins/cuda/libbackplane-cuda-impl.la > make.log 2>&1 &&
    make install-libLTLIBRARIES install-cudapluginLTLIBRARIES DESTDIR="$build/inst-nonccl" \
        >> make.log 2>&1) ||
    { tail -30 "$build/nonccl/make.log"; die "the build without NCCL failed"; }

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib" "$pack/plugins" "$pack/plugins-nonccl"

# The real executable behind a libtool wrapper (DIR/.libs/NAME), else the program itself.
real() {
    d=$(dirname "$1")
    n=$(basename "$1")
    if [ -f "$d/.libs/$n" ]; then echo "$d/.libs/$n"; else echo "$1"; fi
}
b=$build/main
inst=$build/inst/opt/backplane-gpu
for p in tests/test-cuda tests/test-cuda-load bench/bench-matmul bench/bench-ops; do
    cp "$(real "$b/$p")" "$pack/bin/"
done
cp "$inst/bin/backplane" "$pack/bin/"
cp -P "$inst"/lib/libbackplane.so.* "$pack/lib/"
cp "$inst"/plugins/*.so "$pack/plugins/"
cp "$build"/inst-nonccl/opt/backplane-gpu/plugins/backplane-cuda.so \
    "$build"/inst-nonccl/opt/backplane-gpu/plugins/libbackplane-cuda-impl.so "$pack/plugins-nonccl/"

# Libraries the programs and plugins need beyond glibc, the compiler runtime and CUDA: a GPU
# machine without Check has no libsubunit, for one.
system_lib() {
    case "$1" in
    linux-vdso* | ld-linux* | libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | \
        libgcc_s.so* | libstdc++.so* | libcuda.so* | libcudart.so* | libcublas.so* | \
        libcublasLt.so* | libnccl.so* | libbackplane.so*) return 0 ;;
    esac
    return 1
}
for f in "$pack"/bin/* "$pack"/plugins/*.so "$pack"/plugins-nonccl/*.so; do
    LD_LIBRARY_PATH="$pack/lib" ldd "$f" 2>/dev/null > "$build/ldd" || true
    while read -r name arrow path rest; do
        [ "$arrow" = "=>" ] || continue
        system_lib "$name" && continue
        [ -f "$path" ] || die "$f needs $name, which is not found here"
        [ -f "$pack/lib/$name" ] || cp -L "$path" "$pack/lib/$name"
    done < "$build/ldd"
done

strip --strip-unneeded "$pack"/bin/* "$pack"/plugins/*.so "$pack"/plugins-nonccl/*.so \
    "$pack"/lib/*.so* 2>/dev/null || true

# Nothing may point back into the build directory.
if grep -rl "$build" "$pack" > "$build/refs" 2>/dev/null; then
    sed 's/^/  /' "$build/refs"
    die "these files name the temporary build directory"
fi

size=$(du -sb "$pack" | cut -f1)
{
    echo "built: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -m)"
    echo "commit: $(cd "$top" && git rev-parse --short HEAD 2>/dev/null || echo unknown)$(cd "$top" && git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "arch: $arch"
    echo "nvcc: $("$(sed -n 's/^NVCC = //p' "$b/Makefile")" --version | tail -n 1)"
    echo "libraries: $(sed -n 's/^CUDA_LIBS = //p' "$b/Makefile")"
    echo "nccl: $(grep -q '^#define BP_HAVE_NCCL 1' "$b/config.h" && echo yes || echo no)"
    echo "size: $size bytes"
} > "$pack/BUILD-INFO"
[ "$size" -le "$limit" ] || die "$pack is $size bytes, over the 64 MiB a carry may take"
say "$pack: $((size / 1024)) KiB, in $(($(date +%s) - start)) s"
say "on the GPU machine: sh tests/gpu/run.sh $(basename "$pack") (see docs/cuda.md)"
