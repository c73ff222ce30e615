# Install layout (GNUInstallDirs) in four components, which are also the
# binary packages (cmake/Packaging.cmake):
#   runtime      libkvxfer.so.0 and libkvxfer.so.0.MINOR.PATCH (core, tcp, shm)
#   verbs        the verbs plugin, LIBDIR/kvxfer-0/libkvxfer-verbs.so (with
#                -DKVX_PLUGINS=OFF the backend is in libkvxfer.so.0 instead)
#   development  kvxfer.h, the libkvxfer.so link, kvxfer.pc, the CMake package
#                (kvxfer::kvxfer), man pages of section 3 and kvxfer(7)
#   tools        kvxfer-bench, kvxfer-info and their man pages
# `cmake --install BUILD --prefix P` installs all of them; a relocated prefix
# works because kvxfer.pc and the CMake package locate themselves.
include(CMakePackageConfigHelpers)

set(KVX_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvxfer)

install(TARGETS kvxfer EXPORT kvxferTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    COMPONENT runtime NAMELINK_COMPONENT development)
if(TARGET kvxfer-verbs)
  install(TARGETS kvxfer-verbs LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/kvxfer-0 COMPONENT verbs)
endif()
install(FILES include/kvxfer.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
# the parts kvxfer.h includes (never included alone)
install(FILES include/kvxfer/stats.h include/kvxfer/log.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvxfer COMPONENT development)
install(FILES ${CMAKE_BINARY_DIR}/kvxfer.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT development)

# kvxfer::kvxfer carries only the include directory and the library: its
# PRIVATE dependencies (OpenSSL, rdma-core, kvxfer_core) are not exported.
install(EXPORT kvxferTargets NAMESPACE kvxfer:: FILE kvxferTargets.cmake
  DESTINATION ${KVX_INSTALL_CMAKEDIR} COMPONENT development)
configure_package_config_file(cmake/kvxferConfig.cmake.in
  ${CMAKE_BINARY_DIR}/kvxferConfig.cmake
  INSTALL_DESTINATION ${KVX_INSTALL_CMAKEDIR} NO_SET_AND_CHECK_MACRO)
# SameMajorVersion matches the SONAME: every 0.x is ABI-compatible with the
# 0.y <= x it was asked for (docs/versioning.md).
write_basic_package_version_file(${CMAKE_BINARY_DIR}/kvxferConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/kvxferConfig.cmake ${CMAKE_BINARY_DIR}/kvxferConfigVersion.cmake
  DESTINATION ${KVX_INSTALL_CMAKEDIR} COMPONENT development)

if(TARGET kvxfer-bench)
  install(TARGETS kvxfer-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
endif()
# kvxfer-info carries its own copy of the library (the core archive), so it
# reports this build whatever libkvxfer.so.0 the loader would find.
install(TARGETS kvxfer-info RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)

# Man pages (roff sources in docs/man), installed gzip -9n compressed. A page
# whose whole text is ".so man3/OTHER.3" is an alias: installed as a symlink to
# OTHER.3.gz, as dh_installman does.
file(GLOB KVX_MAN_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/docs/man/*.[137])
find_program(KVX_GZIP gzip)
set(KVX_MAN_OUT ${CMAKE_BINARY_DIR}/man)
set(KVX_MAN_OUTPUTS)
foreach(src IN LISTS KVX_MAN_SOURCES)
  get_filename_component(page ${src} NAME)
  string(REGEX REPLACE ".*\\.([137])$" "\\1" sect ${page})
  if(sect STREQUAL "1")
    set(comp tools)
  else()
    set(comp development)
  endif()
  file(STRINGS ${src} lines LIMIT_COUNT 2)
  list(LENGTH lines nlines)
  if(nlines EQUAL 1 AND lines MATCHES "^\\.so man[137]/(.+)$")
    set(target ${CMAKE_MATCH_1})
    if(KVX_GZIP)
      string(APPEND target .gz)
      string(APPEND page .gz)
    endif()
    file(MAKE_DIRECTORY ${KVX_MAN_OUT}/man${sect})
    file(CREATE_LINK ${target} ${KVX_MAN_OUT}/man${sect}/${page} SYMBOLIC)
    install(FILES ${KVX_MAN_OUT}/man${sect}/${page}
      DESTINATION ${CMAKE_INSTALL_MANDIR}/man${sect} COMPONENT ${comp})
  elseif(KVX_GZIP)
    set(out ${KVX_MAN_OUT}/man${sect}/${page}.gz)
    add_custom_command(OUTPUT ${out}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${KVX_MAN_OUT}/man${sect}
      COMMAND ${KVX_GZIP} -9n -c ${src} > ${out}
      DEPENDS ${src} VERBATIM)
    list(APPEND KVX_MAN_OUTPUTS ${out})
    install(FILES ${out} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${sect} COMPONENT ${comp})
  else()
    install(FILES ${src} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${sect} COMPONENT ${comp})
  endif()
endforeach()
if(KVX_MAN_OUTPUTS)
  add_custom_target(kvxfer-man ALL DEPENDS ${KVX_MAN_OUTPUTS})
endif()
