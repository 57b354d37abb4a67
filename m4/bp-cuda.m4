# bp-cuda.m4 - finding the CUDA toolkit (nvcc, cudart, cuBLAS) and NCCL for plugins/cuda.
#
# BP_CHECK_CUDA: --with-cuda[=DIR] (default: auto; looks in DIR, then $CUDA_HOME, then
# /usr/local/cuda), --with-nccl[=DIR] (default: auto; the CUDA directory, then the system) and
# --with-cuda-arch=LIST (default: sm_90 and PTX for compute_90). Sets NVCC, CUDA_CPPFLAGS,
# CUDA_LDFLAGS, CUDA_LIBS, NVCC_ARCH_FLAGS, the conditional BP_CUDA and have_cuda/have_nccl
# with cuda_summary for configure's closing notice. With CUDA asked for explicitly and not
# found, configure stops; in auto mode the plugin is simply not built.
AC_DEFUN([BP_CHECK_CUDA], [
AC_ARG_WITH([cuda],
  [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@],
    [build the CUDA plugin with the toolkit in DIR @<:@default: auto, /usr/local/cuda@:>@])],
  [], [with_cuda=auto])
AC_ARG_WITH([nccl],
  [AS_HELP_STRING([--with-nccl@<:@=DIR@:>@],
    [use NCCL from DIR for the CUDA plugin's collectives @<:@default: auto@:>@])],
  [], [with_nccl=auto])
AC_ARG_WITH([cuda-arch],
  [AS_HELP_STRING([--with-cuda-arch=LIST],
    [comma-separated GPU architectures for nvcc, e.g. sm_80,sm_90 @<:@sm_90 plus PTX@:>@])],
  [], [with_cuda_arch=sm_90])

have_cuda=no
have_nccl=no
cuda_summary="not built (CUDA not requested)"
AS_IF([test "x$with_cuda" != xno], [
  cuda_dirs=
  AS_CASE([$with_cuda],
    [yes|auto], [cuda_dirs="${CUDA_HOME:+$CUDA_HOME }/usr/local/cuda"],
    [cuda_dirs="$with_cuda"])
  cuda_dir=
  for d in $cuda_dirs; do
    AS_IF([test -x "$d/bin/nvcc" && test -f "$d/include/cuda_runtime_api.h"],
      [cuda_dir="$d"; break])
  done
  AS_IF([test -n "$cuda_dir"], [
    NVCC="$cuda_dir/bin/nvcc"
    CUDA_CPPFLAGS="-isystem $cuda_dir/include"
    CUDA_LDFLAGS="-L$cuda_dir/lib64"
    AS_IF([test -d "$cuda_dir/lib"], [CUDA_LDFLAGS="$CUDA_LDFLAGS -L$cuda_dir/lib"])
    bp_save_CPPFLAGS="$CPPFLAGS"; bp_save_LDFLAGS="$LDFLAGS"; bp_save_LIBS="$LIBS"
    CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS"; LDFLAGS="$LDFLAGS $CUDA_LDFLAGS"
    AC_CHECK_HEADERS([cuda_runtime_api.h cublas_v2.h], [], [cuda_dir=])
    AS_IF([test -n "$cuda_dir"], [AC_CHECK_LIB([cudart], [cudaGetDeviceCount], [], [cuda_dir=])])
    AS_IF([test -n "$cuda_dir"], [AC_CHECK_LIB([cublas], [cublasCreate_v2], [], [cuda_dir=])])
    CUDA_LIBS="-lcublas -lcudart"
    AS_IF([test -n "$cuda_dir" && test "x$with_nccl" != xno], [
      AS_CASE([$with_nccl], [yes|auto], [], [
        CUDA_CPPFLAGS="$CUDA_CPPFLAGS -isystem $with_nccl/include"
        CUDA_LDFLAGS="$CUDA_LDFLAGS -L$with_nccl/lib"
        CPPFLAGS="$CPPFLAGS -I$with_nccl/include"; LDFLAGS="$LDFLAGS -L$with_nccl/lib"])
      AC_CHECK_HEADER([nccl.h],
        [AC_CHECK_LIB([nccl], [ncclCommInitAll], [have_nccl=yes])])
      AS_IF([test "x$have_nccl" = xyes],
        [CUDA_LIBS="-lnccl $CUDA_LIBS"
         AC_DEFINE([BP_HAVE_NCCL], [1], [Define to 1 when the CUDA plugin uses NCCL.])],
        [AS_IF([test "x$with_nccl" != xauto], [AC_MSG_ERROR([NCCL was requested but not found])])])
    ])
    CPPFLAGS="$bp_save_CPPFLAGS"; LDFLAGS="$bp_save_LDFLAGS"; LIBS="$bp_save_LIBS"
  ])
  AS_IF([test -n "$cuda_dir"], [
    have_cuda=yes
    NVCC_ARCH_FLAGS=
    bp_last_arch=
    for a in `echo "$with_cuda_arch" | tr ',' ' '`; do
      AS_CASE([$a],
        [sm_*], [n=`echo $a | sed 's/^sm_//'`
                 NVCC_ARCH_FLAGS="$NVCC_ARCH_FLAGS -gencode arch=compute_$n,code=sm_$n"
                 bp_last_arch=$n],
        [AC_MSG_ERROR([--with-cuda-arch: '$a' is not of the form sm_NN])])
    done
    AS_IF([test -z "$bp_last_arch"], [AC_MSG_ERROR([--with-cuda-arch: no architecture given])])
    dnl PTX of the newest architecture, so that later GPUs can still JIT-compile the kernels.
    NVCC_ARCH_FLAGS="$NVCC_ARCH_FLAGS -gencode arch=compute_$bp_last_arch,code=compute_$bp_last_arch"
    cuda_summary="yes ($cuda_dir; $with_cuda_arch + PTX; NCCL: $have_nccl)"
  ], [
    AS_IF([test "x$with_cuda" != xauto],
      [AC_MSG_ERROR([CUDA was requested (--with-cuda=$with_cuda) but nvcc, cuda_runtime_api.h, cudart or cuBLAS was not found])])
    cuda_summary="not built (no CUDA toolkit found; --with-cuda=DIR)"
  ])
])
AC_SUBST([NVCC])
AC_SUBST([CUDA_CPPFLAGS])
AC_SUBST([CUDA_LDFLAGS])
AC_SUBST([CUDA_LIBS])
AC_SUBST([NVCC_ARCH_FLAGS])
AM_CONDITIONAL([BP_CUDA], [test "x$have_cuda" = xyes])
])
