# Binary packages with CPack: one package per install component.
#
#   component    .deb                 .rpm
#   runtime      libkvxfer0           kvxfer-libs      (core, tcp, shm)
#   verbs        libkvxfer0-verbs     kvxfer-verbs     (LIBDIR/kvxfer-0/libkvxfer-verbs.so,
#                                                       a plugin build only)
#   development  libkvxfer-dev        kvxfer-devel
#   tools        kvxfer-tools         kvxfer-tools
#   python       python3-kvxfer       -                (bindings/python, built by
#                                                       cmake/PythonPackage.cmake)
#
# Driven by packaging/build-deb.sh and packaging/build-rpm.sh, which configure
# a build tree per format (-DKVX_PACKAGE=DEB|RPM, prefix /usr; RPM also
# CMAKE_INSTALL_LIBDIR=lib64) and run cpack. KVX_PACKAGE adds the files each
# format requires per package (Debian: copyright + changelog.Debian.gz in
# /usr/share/doc/PKG; RPM: the license under /usr/share/licenses/PKG).
set(KVX_PACKAGE "" CACHE STRING "Package format this tree is configured for: DEB, RPM or empty")

set(KVX_PKG_MAINTAINER "kvxfer maintainers <kvxfer@kvxfer.invalid>")
set(KVX_PKG_HOMEPAGE "https://kvxfer.invalid")
# SPDX id of the license stated in packaging/debian/copyright.
set(KVX_PKG_LICENSE "Apache-2.0")
set(KVX_PKG_RELEASE 1)
set(KVX_PKG_DIR ${CMAKE_SOURCE_DIR}/packaging)

set(KVX_DEB_runtime libkvxfer0)
set(KVX_DEB_verbs libkvxfer0-verbs)
set(KVX_DEB_development libkvxfer-dev)
set(KVX_DEB_tools kvxfer-tools)
set(KVX_DEB_python python3-kvxfer)
set(KVX_RPM_runtime kvxfer-libs)
set(KVX_RPM_verbs kvxfer-verbs)
set(KVX_RPM_development kvxfer-devel)
set(KVX_RPM_tools kvxfer-tools)
set(KVX_RPM_python python3-kvxfer)

include(${CMAKE_CURRENT_LIST_DIR}/PythonPackage.cmake)

# Components that exist in this tree, in a fixed order.
get_cmake_property(_kvx_installed_components COMPONENTS)
set(KVX_PKG_COMPONENTS runtime)
if(verbs IN_LIST _kvx_installed_components)
  list(APPEND KVX_PKG_COMPONENTS verbs)
endif()
list(APPEND KVX_PKG_COMPONENTS development)
foreach(c tools python)
  if(c IN_LIST _kvx_installed_components)
    list(APPEND KVX_PKG_COMPONENTS ${c})
  endif()
endforeach()

# Per-package documentation required by the format.
if(KVX_PACKAGE STREQUAL "DEB")
  find_program(KVX_GZIP_PKG gzip REQUIRED)
  set(_changelog ${CMAKE_BINARY_DIR}/packaging/changelog.Debian.gz)
  add_custom_command(OUTPUT ${_changelog}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/packaging
    COMMAND ${KVX_GZIP_PKG} -9n -c ${KVX_PKG_DIR}/debian/changelog > ${_changelog}
    DEPENDS ${KVX_PKG_DIR}/debian/changelog VERBATIM)
  add_custom_target(kvxfer-deb-changelog ALL DEPENDS ${_changelog})
  foreach(c IN LISTS KVX_PKG_COMPONENTS)
    install(FILES ${KVX_PKG_DIR}/debian/copyright ${_changelog}
      DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/${KVX_DEB_${c}} COMPONENT ${c})
    # Not uploaded to the Debian archive, so no ITP bug for the changelog to close.
    file(WRITE ${CMAKE_BINARY_DIR}/packaging/lintian/${KVX_DEB_${c}}
      "${KVX_DEB_${c}}: initial-upload-closes-no-bugs\n")
    install(FILES ${CMAKE_BINARY_DIR}/packaging/lintian/${KVX_DEB_${c}}
      DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/lintian/overrides COMPONENT ${c})
  endforeach()
elseif(KVX_PACKAGE STREQUAL "RPM")
  foreach(c IN LISTS KVX_PKG_COMPONENTS)
    install(FILES ${KVX_PKG_DIR}/debian/copyright
      DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/licenses/${KVX_RPM_${c}} COMPONENT ${c})
  endforeach()
elseif(KVX_PACKAGE)
  message(FATAL_ERROR "KVX_PACKAGE must be DEB, RPM or empty, not '${KVX_PACKAGE}'")
endif()

# ---------------------------------------------------------------- common
set(CPACK_PACKAGE_NAME kvxfer)
set(CPACK_PACKAGE_VENDOR "kvxfer")
set(CPACK_PACKAGE_CONTACT "${KVX_PKG_MAINTAINER}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_HOMEPAGE_URL "${KVX_PKG_HOMEPAGE}")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL ${KVX_PKG_COMPONENTS})
set(CPACK_COMPONENTS_GROUPING IGNORE)
set(CPACK_COMPONENT_VERBS_DEPENDS runtime)
set(CPACK_COMPONENT_DEVELOPMENT_DEPENDS runtime)
set(CPACK_COMPONENT_TOOLS_DEPENDS runtime)
set(CPACK_COMPONENT_PYTHON_DEPENDS runtime)
set(CPACK_GENERATOR DEB RPM)
set(CPACK_SOURCE_GENERATOR "")
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)

set(_kvx_about
"kvxfer moves KV-cache blocks between the hosts of an LLM-inference service.
A transport owns one local memory region of fixed-size blocks; peers write
local blocks into each other's regions with one-sided semantics (the target
calls nothing for the bytes to land) over RDMA verbs (InfiniBand, RoCE,
iWARP) or authenticated TCP. It implements the data-plane contract of vLLM's
DataTransport behind a small C ABI.")
set(_kvx_summary_runtime "one-sided KV-cache block transfer library")
set(_kvx_summary_verbs "one-sided KV-cache block transfer library (RDMA verbs backend)")
set(_kvx_summary_development "one-sided KV-cache block transfer library (development files)")
set(_kvx_summary_tools "benchmark, verifier and host diagnostics for kvxfer")
set(_kvx_summary_python "Python 3 bindings of the kvxfer transfer library")
set(_kvx_more_runtime
"This package contains the shared library libkvxfer.so.0 with the tcp and shm
backends. The RDMA verbs backend is a plugin in its own package, so that this
one needs no rdma-core library.")
set(_kvx_more_verbs
"This package contains the verbs backend (InfiniBand, RoCE, iWARP through
rdma-core), a plugin that libkvxfer.so.0 loads from its kvxfer-0 directory on
first use of backend=verbs. It must come from the same build as
libkvxfer.so.0. Using RDMA hardware also needs rdma-core's user-space driver
for it (ibverbs-providers).")
set(_kvx_more_development
"This package contains the C header kvxfer.h, the pkg-config file, the CMake
package (find_package(kvxfer) gives the target kvxfer::kvxfer) and the
section 3 and 7 manual pages.")
set(_kvx_more_tools
"This package contains kvxfer-bench, which measures throughput and latency of
block transfers between two processes or two hosts and verifies every byte,
and kvxfer-info, which reports which backends are usable on this host and
why not (RDMA devices with their ports and GIDs, locked memory, ptrace
scope, huge pages, the AES-GCM code), as text or JSON.")
set(_kvx_more_python "This package contains the Python 3 module kvxfer.")

# ---------------------------------------------------------------- DEB
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE ${KVX_PKG_RELEASE})
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${KVX_PKG_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "${KVX_PKG_HOMEPAGE}")
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# kvxfer-bench links libkvxfer.so.0 from the runtime package being built:
# dpkg-shlibdeps finds it in the build tree, and the exact-version
# dependency on libkvxfer0 comes from the component dependency.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR})
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_VERBS_PACKAGE_SECTION libs)
# ipsec-mb is loaded on first use, not linked (dpkg-shlibdeps does not see
# it): protected tcp runs on OpenSSL without it, several times faster with
# it on VAES CPUs.
if(KVX_HAVE_IPSEC_MB)
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_RECOMMENDS "libipsec-mb1")
endif()
# The verbs plugin: libkvxfer0 (= this version-release) from the component
# dependency, libibverbs1 and librdmacm1 from dpkg-shlibdeps. A host needs a
# provider for its RDMA device too (rdma-core's ibverbs-providers), which the
# library does not link: recommended.
if("verbs" IN_LIST KVX_PKG_COMPONENTS)
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS "${KVX_DEB_verbs}")
  set(CPACK_DEBIAN_VERBS_PACKAGE_RECOMMENDS "ibverbs-providers")
  set(CPACK_DEBIAN_VERBS_PACKAGE_MULTIARCH same)
endif()
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_MULTIARCH same)
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_MULTIARCH same)

# libkvxfer0's control files: the ldconfig trigger, shlibs and a symbols file
# with one (symver) pattern per version node of src/kvxfer.map, each node
# KVXFER_X.Y first released in X.Y.0 (docs/versioning.md). Only the public
# nodes: the map is read from src/kvxfer.map, never from the build's
# gen/kvxfer.map, so the private node KVXFER_PRIVATE (src/kvxfer-private.map,
# the internals libkvxfer-verbs.so calls, different in every build) is not
# listed. Its one user, the plugin, depends on the exact version-release.
# libkvxfer0-verbs gets no control file: its plugin has no SONAME and sits
# in a private directory (no shlibs, symbols or ldconfig trigger).
set(_kvx_ctl ${CMAKE_BINARY_DIR}/packaging/deb-runtime)
file(MAKE_DIRECTORY ${_kvx_ctl})
file(WRITE ${_kvx_ctl}/triggers "activate-noawait ldconfig\n")
file(WRITE ${_kvx_ctl}/shlibs "libkvxfer 0 ${KVX_DEB_runtime} (>= ${PROJECT_VERSION})\n")
file(STRINGS ${CMAKE_SOURCE_DIR}/src/kvxfer.map _kvx_nodes REGEX "^[A-Z0-9_.]+ *{")
set(_kvx_symbols "libkvxfer.so.0 ${KVX_DEB_runtime} #MINVER#\n* Build-Depends-Package: ${KVX_DEB_development}\n")
foreach(n IN LISTS _kvx_nodes)
  if(NOT n MATCHES "^KVXFER_[0-9]+\\.[0-9]+")
    message(FATAL_ERROR "src/kvxfer.map: version node '${n}' is not KVXFER_X.Y")
  endif()
  string(REGEX REPLACE "^(KVXFER_([0-9]+)\\.([0-9]+)).*" "\\1;\\2.\\3.0" nv "${n}")
  list(GET nv 0 node)
  list(GET nv 1 since)
  string(APPEND _kvx_symbols " (symver)${node} ${since}\n")
endforeach()
file(WRITE ${_kvx_ctl}/symbols "${_kvx_symbols}")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA
  ${_kvx_ctl}/triggers ${_kvx_ctl}/shlibs ${_kvx_ctl}/symbols)

foreach(c runtime verbs development tools python)
  string(TOUPPER ${c} C)
  set(CPACK_DEBIAN_${C}_PACKAGE_NAME ${KVX_DEB_${c}})
  set(CPACK_DEBIAN_${C}_DESCRIPTION "${_kvx_summary_${c}}\n${_kvx_about}\n\n${_kvx_more_${c}}")
  set(CPACK_COMPONENT_${C}_DESCRIPTION "${_kvx_summary_${c}}")
endforeach()
if(KVX_PY_DEPENDS)
  set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "${KVX_PY_DEPENDS}")
endif()

# ---------------------------------------------------------------- RPM
set(CPACK_RPM_COMPONENT_INSTALL ON)
set(CPACK_RPM_FILE_NAME RPM-DEFAULT)
set(CPACK_RPM_PACKAGE_RELEASE ${KVX_PKG_RELEASE})
set(CPACK_RPM_PACKAGE_LICENSE "${KVX_PKG_LICENSE}")
set(CPACK_RPM_PACKAGE_URL "${KVX_PKG_HOMEPAGE}")
set(CPACK_RPM_PACKAGE_GROUP "System Environment/Libraries")
set(CPACK_RPM_PACKAGE_AUTOREQPROV ON)
set(CPACK_RPM_CHANGELOG_FILE ${KVX_PKG_DIR}/rpm/changelog)
# No /usr/lib/.build-id links: there is no debuginfo package to point into.
# The verbs plugin is a private module, no library to link: it provides
# nothing (no libkvxfer-verbs.so()(64bit)). The internals libkvxfer.so.0
# exports for it (version node KVXFER_PRIVATE) are no interface either:
# kvxfer-libs does not provide them and kvxfer-verbs requires the exact
# kvxfer-libs instead.
string(CONCAT _kvx_rpm_defines
  "%define packager ${KVX_PKG_MAINTAINER}\n"
  "%define _build_id_links none\n"
  "%global __provides_exclude_from ^${CMAKE_INSTALL_FULL_LIBDIR}/kvxfer-0/.*$\n"
  "%global __provides_exclude ^libkvxfer[.]so[.]0[(]KVXFER_PRIVATE[)]\n"
  "%global __requires_exclude ^libkvxfer[.]so[.]0[(]KVXFER_PRIVATE[)]")
set(CPACK_RPM_SPEC_MORE_DEFINE "${_kvx_rpm_defines}")
set(CPACK_RPM_EXCLUDE_FROM_AUTO_FILELIST_ADDITION
  ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig
  ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/cmake
  ${CMAKE_INSTALL_FULL_MANDIR} ${CMAKE_INSTALL_FULL_MANDIR}/man1
  ${CMAKE_INSTALL_FULL_MANDIR}/man3 ${CMAKE_INSTALL_FULL_MANDIR}/man7
  ${CMAKE_INSTALL_FULL_DATAROOTDIR}/licenses)
if(KVX_PY_SITE)  # the interpreter's directories belong to the python package
  list(APPEND CPACK_RPM_EXCLUDE_FROM_AUTO_FILELIST_ADDITION
    ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/python${KVX_PY_VERSION}
    ${CMAKE_INSTALL_PREFIX}/${KVX_PY_SITE})
endif()
set(_kvx_ldconfig ${CMAKE_BINARY_DIR}/packaging/rpm-ldconfig.sh)
file(WRITE ${_kvx_ldconfig} "/sbin/ldconfig\n")
set(CPACK_RPM_RUNTIME_POST_INSTALL_SCRIPT_FILE ${_kvx_ldconfig})
set(CPACK_RPM_RUNTIME_POST_UNINSTALL_SCRIPT_FILE ${_kvx_ldconfig})
set(_kvx_rpm_exact "${KVX_RPM_runtime} = ${PROJECT_VERSION}-${KVX_PKG_RELEASE}")
foreach(c IN LISTS KVX_PKG_COMPONENTS)
  string(TOUPPER ${c} C)
  set(CPACK_RPM_${C}_PACKAGE_NAME ${KVX_RPM_${c}})
  string(SUBSTRING "${_kvx_summary_${c}}" 0 1 first)
  string(SUBSTRING "${_kvx_summary_${c}}" 1 -1 rest)
  string(TOUPPER "${first}" first)
  set(CPACK_RPM_${C}_PACKAGE_SUMMARY "${first}${rest}")
  set(CPACK_RPM_${C}_PACKAGE_DESCRIPTION "${_kvx_about}\n\n${_kvx_more_${c}}")
  if(NOT c STREQUAL "runtime")
    set(CPACK_RPM_${C}_PACKAGE_REQUIRES "${_kvx_rpm_exact}")
  endif()
  set(CPACK_RPM_${C}_USER_FILELIST
    "%license ${CMAKE_INSTALL_FULL_DATAROOTDIR}/licenses/${KVX_RPM_${c}}/copyright")
endforeach()
set(CPACK_RPM_RUNTIME_PACKAGE_GROUP "System Environment/Libraries")
set(CPACK_RPM_VERBS_PACKAGE_GROUP "System Environment/Libraries")
set(_kvx_rpm_suggests)
if(KVX_HAVE_IPSEC_MB)  # loaded on first use (see the Debian Recommends above)
  list(APPEND _kvx_rpm_suggests "intel-ipsec-mb")
endif()
# kvxfer-verbs: kvxfer-libs of this version-release (above), libibverbs and
# librdmacm from rpm's automatic requires.
if("verbs" IN_LIST KVX_PKG_COMPONENTS)
  list(APPEND _kvx_rpm_suggests "${KVX_RPM_verbs}")
endif()
if(_kvx_rpm_suggests)
  list(JOIN _kvx_rpm_suggests ", " _kvx_rpm_suggests)
  set(CPACK_RPM_RUNTIME_PACKAGE_SUGGESTS "${_kvx_rpm_suggests}")
endif()
# CPackRPM (CMake 3.25) keeps weak dependency tags only if
# `${RPM_EXECUTABLE} --suggests` succeeds, but never sets RPM_EXECUTABLE: the
# Suggests above were dropped ("SUGGESTS not supported in provided rpmbuild").
# cpack reads this file before running a generator.
set(_kvx_cpack_project ${CMAKE_BINARY_DIR}/packaging/cpack-project.cmake)
file(WRITE ${_kvx_cpack_project}
"if(CPACK_GENERATOR STREQUAL \"RPM\" AND NOT RPM_EXECUTABLE)
  find_program(RPM_EXECUTABLE rpm)
endif()
")
set(CPACK_PROJECT_CONFIG_FILE ${_kvx_cpack_project})
set(CPACK_RPM_DEVELOPMENT_PACKAGE_GROUP "Development/Libraries")
set(CPACK_RPM_TOOLS_PACKAGE_GROUP "Applications/System")
if(KVX_PY_RPM_REQUIRES)
  set(CPACK_RPM_PYTHON_PACKAGE_REQUIRES "${_kvx_rpm_exact}, ${KVX_PY_RPM_REQUIRES}")
  set(CPACK_RPM_PYTHON_PACKAGE_GROUP "Development/Languages")
endif()

include(CPack)
