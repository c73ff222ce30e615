# The library's layers, one OBJECT library each. A layer sees only the layers
# it names in SEES: its include directory is a farm of symlinks to exactly
# those folders of src/, so an include of another layer fails to compile.
#
#   util <- wire <- handshake <- backend_api (the interface, ops) <- registry
#                                  registry <- backends/shm, backends/tcp, backends/verbs
#                                  registry <- core <- capi
#
# kvx_layer(NAME SOURCES ... SEES dir ... [LIBS lib ...] [IN archive|library ...])
# IN: which of the internal archive (kvxfer_core: tests, tools) and the
# shared library the layer goes into; both unless said (the verbs backend is
# a plugin of the library, built in in the archive: src/backends/verbs).
#
# Layers are compiled with default visibility: the version script of
# libkvxfer (src/kvxfer.map, and KVXFER_PRIVATE for the plugins) decides
# what it exports. -fno-semantic-interposition keeps calls inside a file
# direct and inlinable all the same.
function(kvx_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;SEES;LIBS;IN" ${ARGN})
  if(NOT L_IN)
    set(L_IN archive library)
  endif()
  set(farm ${CMAKE_BINARY_DIR}/layers/${name})
  file(REMOVE_RECURSE ${farm})
  foreach(seen IN LISTS L_SEES)
    get_filename_component(parent ${farm}/${seen} DIRECTORY)
    file(MAKE_DIRECTORY ${parent})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/src/${seen} ${farm}/${seen} SYMBOLIC)
  endforeach()
  file(MAKE_DIRECTORY ${farm})
  add_library(kvx_${name} OBJECT ${L_SOURCES})
  target_include_directories(kvx_${name} PRIVATE ${farm} ${CMAKE_SOURCE_DIR}/include)
  target_compile_definitions(kvx_${name} PRIVATE KVX_BUILDING_LIBRARY)
  target_link_libraries(kvx_${name} PUBLIC ${L_LIBS})
  # -fno-gnu-unique: inline variables stay plain symbols, so libkvxfer can
  # still be unloaded (STB_GNU_UNIQUE pins it); they are constants.
  target_compile_options(kvx_${name} PRIVATE -fno-semantic-interposition $<$<CXX_COMPILER_ID:GNU>:-fno-gnu-unique>)
  if(archive IN_LIST L_IN)
    set_property(GLOBAL APPEND PROPERTY KVX_ARCHIVE_LAYERS kvx_${name})
  endif()
  if(library IN_LIST L_IN)
    set_property(GLOBAL APPEND PROPERTY KVX_LIBRARY_LAYERS kvx_${name})
  endif()
endfunction()

kvx_layer(util
  SOURCES src/util/error.cpp src/util/log.cpp src/util/net.cpp src/util/options.cpp src/util/event_loop.cpp
          src/util/shared_region.cpp src/util/proc_maps.cpp
  SEES util
  LIBS Threads::Threads)
kvx_layer(wire
  SOURCES src/wire/metadata.cpp
  SEES util wire
  LIBS OpenSSL::Crypto)
kvx_layer(handshake
  SOURCES src/handshake/handshake.cpp src/handshake/engine.cpp
  SEES util wire handshake
  LIBS OpenSSL::Crypto)
kvx_layer(backend_api
  SOURCES src/backend_api/ops.cpp
  SEES util wire handshake backend_api)
kvx_layer(registry
  SOURCES src/registry/registry.cpp src/registry/plugin.cpp
  SEES util wire handshake backend_api registry)
kvx_layer(core
  SOURCES src/core/options.cpp src/core/fingerprint.cpp src/core/id_table.cpp src/core/transport.cpp
          src/core/transport_peers.cpp src/core/transport_watchdog.cpp src/core/registrations.cpp src/core/telemetry.cpp src/core/metrics.cpp
          src/core/ready.cpp src/core/prewarm.cpp src/core/hugepages.cpp
  SEES util wire handshake backend_api registry core
  LIBS OpenSSL::Crypto nlohmann_json::nlohmann_json)
kvx_layer(capi
  SOURCES src/capi/api.cpp
  SEES util wire handshake backend_api registry core)

# One line per backend (and its folder's CMakeLists.txt, which calls kvx_layer).
add_subdirectory(src/backends/shm)
add_subdirectory(src/backends/tcp)
if(KVX_VERBS)
  add_subdirectory(src/backends/verbs)
endif()
