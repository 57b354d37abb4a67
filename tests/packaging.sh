#!/bin/sh
# packaging.sh - the Debian packages of packaging/debian, built from the release tarball and
# installed for real: runtime + tools + only the CPU plugin lists the CPU and no Meta; adding the
# meta plugin package makes Meta(CPU0,CPU1) serve the tiny model; removing it takes it away;
# then everything is purged. Changes the system's package set, so it runs only as root (CI's
# fresh machine) and exits 77 (SKIP) otherwise or without dpkg-buildpackage and debhelper.
#
#   tests/packaging.sh TARBALL      (tools/dev.sh check passes the one `make distcheck` made)
set -u
tarball=${1:-}
skip() { echo "SKIP: $*"; exit 77; }
[ -n "$tarball" ] && [ -f "$tarball" ] || { echo "usage: tests/packaging.sh backplane-X.Y.Z.tar.gz" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || skip "not root: installing packages needs root"
command -v dpkg-buildpackage >/dev/null 2>&1 || skip "dpkg-buildpackage is not installed"
[ -x /usr/bin/dh ] || skip "debhelper is not installed"
for p in libbackplane0 backplane-tools backplane-plugin-cpu backplane-plugin-meta backplane-plugin-mpi; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
        skip "$p is already installed on this machine; not touching it"
    fi
done

top=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
pkgs="backplane-plugin-mpi backplane-plugin-meta backplane-plugin-cpu backplane-tools libbackplane0"
cleanup() {
    dpkg -P $pkgs >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT
pass=0
fail=0
check() { # description, command...
    desc=$1
    shift
    if "$@" >"$work/out" 2>&1; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: $desc"
        sed 's/^/    /' "$work/out" | tail -20
    fi
}

tar -C "$work" -xzf "$tarball"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -1)
cp -r "$top/packaging/debian" "$src/debian"
echo "packaging.sh: building the packages (dpkg-buildpackage -us -uc -b)"
if ! (cd "$src" && DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" dpkg-buildpackage -us -uc -b) \
    >"$work/build.log" 2>&1; then
    tail -40 "$work/build.log"
    echo "0 passed, 1 failed"
    exit 1
fi
deb() { ls "$work"/"$1"_*.deb; }
check "the six packages were built" sh -c "ls '$work'/*.deb | grep -v dbgsym | grep -c '\.deb$' | grep -qx 6"
check "libbackplane0 holds the versioned library only" sh -c "dpkg -c \$(ls '$work'/libbackplane0_*.deb) | grep -q 'libbackplane.so.0.0.0' && ! dpkg -c \$(ls '$work'/libbackplane0_*.deb) | grep -q 'include/'"
check "each plugin package holds its plugin" sh -c "dpkg -c \$(ls '$work'/backplane-plugin-cpu_*.deb) | grep -q 'backplane/plugins/backplane-cpu-avx512.so' && dpkg -c \$(ls '$work'/backplane-plugin-meta_*.deb) | grep -q 'backplane/plugins/backplane-meta.so'"
check "the mpi plugin package holds its plugin and depends on Open MPI" sh -c "dpkg -c \$(ls '$work'/backplane-plugin-mpi_*.deb) | grep -q 'backplane/plugins/backplane-mpi.so' && dpkg -f \$(ls '$work'/backplane-plugin-mpi_*.deb) Depends | grep -q 'libopenmpi'"
check "backplane-tools holds the command and its manual page" sh -c "dpkg -c \$(ls '$work'/backplane-tools_*.deb) | grep -q 'usr/bin/backplane\$' && dpkg -c \$(ls '$work'/backplane-tools_*.deb) | grep -q 'usr/share/man/man1/backplane.1'"
check "plugin packages depend on the plugin API" sh -c "dpkg -f \$(ls '$work'/backplane-plugin-meta_*.deb) Depends | grep -q 'backplane-plugin-api-1'"

check "runtime, tools and the CPU plugin install" dpkg -i "$(deb libbackplane0)" "$(deb backplane-tools)" "$(deb backplane-plugin-cpu)"
export BP_PLUGIN_PATH= BP_LOG_LEVEL=error
check "backplane list shows the CPU device and no Meta" sh -c "backplane list | grep -q '^  CPU ' && ! backplane list | grep -qi 'meta'"
check "the tiny model runs on the installed CPU plugin" sh -c "backplane run --model tiny -n 4 | grep -q '^tokens:'"
check "Meta is unknown without its package" sh -c "BP_CPU_DEVICES=2 backplane run -d 'Meta(CPU0,CPU1)' -n 2; test \$? -ne 0"
check "the meta plugin installs" dpkg -i "$(deb backplane-plugin-meta)"
check "Meta(CPU0,CPU1) runs the tiny model" sh -c "BP_CPU_DEVICES=2 backplane run -d 'Meta(CPU0,CPU1)' --model tiny -n 4 --check | grep -q 'tokens agree'"
check "the mpi plugin installs" dpkg -i "$(deb backplane-plugin-mpi)"
check "backplane list shows the MPI registry" sh -c "backplane list | grep -q \"registry 'MPI'\""
if command -v mpirun >/dev/null 2>&1; then
    check "two processes run the tiny model over Meta(CPU0@0,CPU0@1)" sh -c "mpirun -np 2 --oversubscribe --allow-run-as-root -x BP_PLUGIN_PATH -x BP_LOG_LEVEL backplane run -d 'Meta(CPU0@0,CPU0@1)' --model tiny -n 4 --check | grep -q 'tokens agree'"
fi
check "the mpi plugin is removed" dpkg -r backplane-plugin-mpi
check "the meta plugin is removed" dpkg -r backplane-plugin-meta
check "and Meta is gone again" sh -c "! backplane list | grep -qi 'meta' && ! BP_CPU_DEVICES=2 backplane run -d 'Meta(CPU0,CPU1)' -n 2"
check "everything purges" dpkg -P $pkgs
check "nothing is left in the plugin directory" sh -c "! ls /usr/lib/*/backplane/plugins/*.so 2>/dev/null"
echo "$pass passed, $fail failed"
test "$fail" -eq 0
