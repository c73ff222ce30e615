#!/bin/sh
# CMAKE_STRIP of the package builds (cmake --install --strip, CPACK_STRIP_FILES):
# strip as Debian's dh_strip does, also dropping the compiler's .comment and
# .note sections (lintian: binary-has-unneeded-section).
exec strip --remove-section=.comment --remove-section=.note "$@"
