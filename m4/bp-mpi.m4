# BP_CHECK_MPI: the mpi plugin (plugins/mpi) is built where an MPI library is found: Open MPI
# or MPICH through pkg-config (Debian's libopenmpi-dev or libmpich-dev). --without-mpi skips
# it; --with-mpi requires it. Tests run its suite under mpirun when MPIRUN is found.
AC_DEFUN([BP_CHECK_MPI], [
  AC_ARG_WITH([mpi],
    [AS_HELP_STRING([--with-mpi], [build the mpi plugin (default: when MPI is found)])],
    [], [with_mpi=check])
  have_mpi=no
  AS_IF([test "x$with_mpi" != xno], [
    PKG_CHECK_MODULES([MPI], [ompi-c], [have_mpi=yes],
      [PKG_CHECK_MODULES([MPI], [mpich], [have_mpi=yes], [have_mpi=no])])
    AS_IF([test "x$have_mpi" = xyes], [
      bp_save_CPPFLAGS=$CPPFLAGS
      CPPFLAGS="$CPPFLAGS $MPI_CFLAGS"
      AC_CHECK_HEADER([mpi.h], [], [have_mpi=no])
      CPPFLAGS=$bp_save_CPPFLAGS])
    AS_IF([test "x$with_mpi" = xyes && test "x$have_mpi" != xyes],
      [AC_MSG_ERROR([--with-mpi: no MPI found (install libopenmpi-dev)])])
  ])
  AC_PATH_PROGS([MPIRUN], [mpirun mpiexec], [])
  AC_SUBST([MPIRUN])
  AM_CONDITIONAL([HAVE_MPI], [test "x$have_mpi" = xyes])
  AS_IF([test "x$have_mpi" = xyes],
    [mpi_summary="yes ($MPI_CFLAGS $MPI_LIBS; mpirun: ${MPIRUN:-none})"],
    [mpi_summary="no (no MPI library found)"])
])
