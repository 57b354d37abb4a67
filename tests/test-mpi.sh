#!/bin/sh
# The mpi plugin's suite (tests/test-mpi) under `mpirun -np 2` and `-np 3`, on this machine.
# Skipped (exit 77, with the reason) where the plugin was not built or there is no mpirun.
plugin="$BP_TEST_MPI_PLUGIN_DIR/backplane-mpi.so"
if [ ! -f "$plugin" ]; then
    echo "SKIP: the mpi plugin was not built (configure found no MPI: install libopenmpi-dev)"
    exit 77
fi
if [ -z "$MPIRUN" ] || ! command -v "$MPIRUN" >/dev/null 2>&1; then
    echo "SKIP: no mpirun (install openmpi-bin)"
    exit 77
fi
opts=
if "$MPIRUN" --version 2>&1 | grep -q "Open MPI"; then
    # two ranks on a machine that may have fewer cores; root in CI containers
    opts="--oversubscribe"
    [ "$(id -u)" = 0 ] && opts="$opts --allow-run-as-root"
fi
# Under ASan, no leak report: Open MPI leaves allocations of components it has unloaded by
# exit, which LeakSanitizer cannot attribute (so no suppression can name them); memory errors
# are still reported. The plugin's own allocations are freed by bp_comm_free.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export ASAN_OPTIONS
# Every test under 2 ranks; the collectives' tests again under 3, where a small sum takes the
# recursive doubling's fold and unfold.
# shellcheck disable=SC2086
timeout 300 "$MPIRUN" -np 2 $opts "${top_builddir:-.}/tests/test-mpi" || exit 1
# shellcheck disable=SC2086
exec timeout 300 "$MPIRUN" -np 3 $opts "${top_builddir:-.}/tests/test-mpi" --any-ranks
