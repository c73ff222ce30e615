# Runs one libFuzzer binary for a bounded time on a copy of the committed
# corpus (the source tree is never written):
#   cmake -DFUZZER=bin -DSEEDS=dir -DWORK=dir -DSECONDS=n [-DDICT=file] -P run_fuzzer.cmake
# WORK/corpus keeps what earlier runs found (the seeds are copied in again each
# run); crash/leak/timeout inputs land in WORK/artifacts/.
foreach(v FUZZER SEEDS WORK SECONDS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_fuzzer.cmake: -D${v}= is required")
  endif()
endforeach()

file(MAKE_DIRECTORY ${WORK}/corpus ${WORK}/artifacts)
file(GLOB _seeds ${SEEDS}/*)
if(NOT _seeds)
  message(FATAL_ERROR "no seed inputs in ${SEEDS}")
endif()
file(COPY ${_seeds} DESTINATION ${WORK}/corpus)

set(_args -max_total_time=${SECONDS} -rss_limit_mb=2048 -timeout=30 -print_final_stats=1
          -artifact_prefix=${WORK}/artifacts/)
if(DEFINED DICT AND EXISTS ${DICT})
  list(APPEND _args -dict=${DICT})
endif()

string(REPLACE ";" " " _shown "${_args}")
message(STATUS "${FUZZER} ${_shown} ${WORK}/corpus")
execute_process(COMMAND ${FUZZER} ${_args} ${WORK}/corpus RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  file(GLOB _crashes ${WORK}/artifacts/*)
  message(FATAL_ERROR "fuzzer exited with ${_rc}; reproducer(s): ${_crashes}\n"
                      "replay with: ${FUZZER} <file>")
endif()
