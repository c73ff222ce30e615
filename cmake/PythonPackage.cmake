# The Python module (bindings/python: a setuptools + SWIG build) as install
# component "python", packaged as python3-kvxfer in both formats. The
# extension is built for this machine's /usr/bin/python3, so the package
# depends on exactly that Python minor version: python3 (>= 3.X), python3
# (<< 3.X+1) on Debian; python(abi) = 3.X on RPM distributions, installed
# under lib64/python3.X/site-packages (Fedora/RHEL layout).
# -DKVX_PACKAGE_PYTHON=OFF leaves it out.
option(KVX_PACKAGE_PYTHON "Package bindings/python as python3-kvxfer" ON)

if(NOT (KVX_PACKAGE MATCHES "^(DEB|RPM)$" AND KVX_PACKAGE_PYTHON
        AND EXISTS ${CMAKE_SOURCE_DIR}/bindings/python/setup.py))
  return()
endif()

# Debian's interpreter on purpose: the package targets its ABI, not a pyenv one.
find_program(KVX_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
find_program(KVX_SWIG NAMES swig swig4.0)
find_program(KVX_STRIP strip)
if(NOT KVX_PYTHON3 OR NOT KVX_SWIG)
  message(FATAL_ERROR "python3-kvxfer needs /usr/bin/python3, python3-dev, python3-setuptools "
    "and swig (or configure with -DKVX_PACKAGE_PYTHON=OFF)")
endif()
execute_process(COMMAND ${KVX_PYTHON3} -c "import sys; print('%d.%d' % sys.version_info[:2])"
  OUTPUT_VARIABLE KVX_PY_VERSION OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
string(REGEX REPLACE "^([0-9]+)\\.([0-9]+)$" "\\2" _kvx_py_minor "${KVX_PY_VERSION}")
math(EXPR _kvx_py_next "${_kvx_py_minor} + 1")
# An extension module works with this Python minor version only.
set(KVX_PY_DEPENDS "python3 (>= ${KVX_PY_VERSION}), python3 (<< 3.${_kvx_py_next})")
set(KVX_PY_RPM_REQUIRES "python(abi) = ${KVX_PY_VERSION}")
if(KVX_PACKAGE STREQUAL "RPM")
  set(KVX_PY_SITE ${CMAKE_INSTALL_LIBDIR}/python${KVX_PY_VERSION}/site-packages)
else()
  set(KVX_PY_SITE lib/python3/dist-packages)
endif()

file(GLOB_RECURSE _kvx_py_sources CONFIGURE_DEPENDS
  ${CMAKE_SOURCE_DIR}/bindings/python/setup.py
  ${CMAKE_SOURCE_DIR}/bindings/python/kvxfer/*.py
  ${CMAKE_SOURCE_DIR}/bindings/python/swig/*.i)
set(_py ${CMAKE_BINARY_DIR}/python-package)
# setup.py finds the library through KVXFER_PREFIX (include/kvxfer.h and
# lib/libkvxfer.so): a small prefix of links into this tree. It builds from a
# copy, so the source tree stays clean; KVXFER_RPATH=0 since the package's
# library is on the loader's default path.
add_custom_command(OUTPUT ${_py}/stamp
  COMMAND ${CMAKE_COMMAND} -E rm -rf ${_py}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${_py}/prefix/include ${_py}/prefix/lib
  COMMAND ${CMAKE_COMMAND} -E copy_directory ${CMAKE_SOURCE_DIR}/bindings/python ${_py}/src
  COMMAND ${CMAKE_COMMAND} -E create_symlink ${CMAKE_SOURCE_DIR}/include/kvxfer.h ${_py}/prefix/include/kvxfer.h
  COMMAND ${CMAKE_COMMAND} -E create_symlink ${CMAKE_SOURCE_DIR}/include/kvxfer ${_py}/prefix/include/kvxfer
  COMMAND ${CMAKE_COMMAND} -E create_symlink $<TARGET_LINKER_FILE:kvxfer> ${_py}/prefix/lib/libkvxfer.so
  COMMAND ${CMAKE_COMMAND} -E chdir ${_py}/src
          ${CMAKE_COMMAND} -E env KVXFER_PREFIX=${_py}/prefix KVXFER_RPATH=0 SWIG=${KVX_SWIG}
          "CFLAGS=${CMAKE_C_FLAGS}" "LDFLAGS=${CMAKE_SHARED_LINKER_FLAGS}"
          ${KVX_PYTHON3} setup.py -q build --build-base ${_py}/build --build-lib ${_py}/lib
  # the distribution's metadata, for its entry point: vLLM finds the kvxfer
  # plugin (vllm.general_plugins) through it
  COMMAND ${CMAKE_COMMAND} -E make_directory ${_py}/meta
  COMMAND ${CMAKE_COMMAND} -E chdir ${_py}/src
          ${CMAKE_COMMAND} -E env KVXFER_PREFIX=${_py}/prefix KVXFER_RPATH=0 SWIG=${KVX_SWIG}
          ${KVX_PYTHON3} setup.py -q egg_info --egg-base ${_py}/meta
  COMMAND sh -c "${KVX_STRIP} --strip-unneeded --remove-section=.comment --remove-section=.note \"$0\"/kvxfer/*.so" ${_py}/lib
  COMMAND ${CMAKE_COMMAND} -E touch ${_py}/stamp
  DEPENDS kvxfer ${_kvx_py_sources}
  COMMENT "Building the Python module for python3-kvxfer"
  VERBATIM)
add_custom_target(kvxfer-python-package ALL DEPENDS ${_py}/stamp)
install(DIRECTORY ${_py}/lib/kvxfer DESTINATION ${KVX_PY_SITE} COMPONENT python
  PATTERN __pycache__ EXCLUDE)
install(DIRECTORY ${_py}/meta/kvxfer.egg-info DESTINATION ${KVX_PY_SITE} COMPONENT python
  PATTERN SOURCES.txt EXCLUDE PATTERN dependency_links.txt EXCLUDE)
