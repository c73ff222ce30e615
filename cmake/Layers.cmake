# The library's layers, one OBJECT library each. A layer sees only the layers
# it names in SEES: its include directory is a farm of symlinks to exactly
# those folders of src/, so an include of another layer fails to compile.
#
#   util <- wire <- handshake <- backend_api (the interface, ops) <- registry
#                                  registry <- backends/shm, backends/tcp, backends/verbs
#                                  registry <- core <- capi
#
# kvx_layer(NAME SOURCES ... SEES dir ... [LIBS lib ...])
function(kvx_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;SEES;LIBS" ${ARGN})
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
  set_target_properties(kvx_${name} PROPERTIES
    C_VISIBILITY_PRESET hidden CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  set_property(GLOBAL APPEND PROPERTY KVX_LAYERS kvx_${name})
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
  SOURCES src/registry/registry.cpp
  SEES util wire handshake backend_api registry)
kvx_layer(core
  SOURCES src/core/options.cpp src/core/fingerprint.cpp src/core/id_table.cpp src/core/transport.cpp
          src/core/transport_peers.cpp src/core/registrations.cpp src/core/telemetry.cpp src/core/metrics.cpp
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
