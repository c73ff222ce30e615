# Writes OUT: KVX_BUILD_ID, the version and a digest of every header the
# library's code includes (src/**/*.h, include/*.h) and of how it was
# compiled (CONFIG: compiler, its version, build type, flags, definitions).
# A plugin is loaded only by a library of the same id (src/registry/plugin.h):
# its objects share the library's classes.
# cmake -DOUT=file -DVERSION=x.y.z -DSRC=source-dir -DCONFIG=text -P BuildId.cmake
file(GLOB_RECURSE headers ${SRC}/src/*.h ${SRC}/include/*.h)
list(SORT headers)
set(acc "${VERSION}\n${CONFIG}")
foreach(h IN LISTS headers)
  file(SHA256 ${h} digest)
  file(RELATIVE_PATH rel ${SRC} ${h})
  string(APPEND acc "\n${rel} ${digest}")
endforeach()
string(SHA256 id "${acc}")
string(SUBSTRING ${id} 0 16 id)
file(WRITE ${OUT} "// Written by cmake/BuildId.cmake: what a plugin must match.\n#pragma once\n#define KVX_BUILD_ID \"${VERSION}+${id}\"\n")
