# bp-cflags.m4 - compiler flag probes for backplane.

# BP_CHECK_CFLAG(FLAG, [ACTION-IF-OK], [ACTION-IF-NOT])
# Compiles an empty program with FLAG (warnings fatal) to see whether the compiler takes it.
AC_DEFUN([BP_CHECK_CFLAG], [
  AS_VAR_PUSHDEF([bp_cv], [bp_cv_cflag_$1])
  AC_CACHE_CHECK([whether $CC accepts $1], [bp_cv], [
    bp_save_CFLAGS="$CFLAGS"
    CFLAGS="$CFLAGS -Werror $1"
    AC_COMPILE_IFELSE([AC_LANG_PROGRAM([], [])], [AS_VAR_SET([bp_cv], [yes])], [AS_VAR_SET([bp_cv], [no])])
    CFLAGS="$bp_save_CFLAGS"])
  AS_VAR_IF([bp_cv], [yes], [$2], [$3])
  AS_VAR_POPDEF([bp_cv])
])

# BP_SET_WARN_CFLAGS: the warning set every file of the project compiles clean with.
AC_DEFUN([BP_SET_WARN_CFLAGS], [
  BP_WARN_CFLAGS=""
  for bp_flag in -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
                 -Wpointer-arith -Wformat=2 -Wno-format-nonliteral; do
    BP_CHECK_CFLAG([$bp_flag], [BP_WARN_CFLAGS="$BP_WARN_CFLAGS $bp_flag"])
  done
  AC_SUBST([BP_WARN_CFLAGS])
])

# BP_SET_VISIBILITY_CFLAGS: hide everything not marked BP_API, so the ABI is what the headers say.
AC_DEFUN([BP_SET_VISIBILITY_CFLAGS], [
  BP_VISIBILITY_CFLAGS=""
  BP_CHECK_CFLAG([-fvisibility=hidden], [BP_VISIBILITY_CFLAGS="-fvisibility=hidden"])
  AC_SUBST([BP_VISIBILITY_CFLAGS])
])
