# Runs one fuzzer for a bounded time (the test Fuzz.<target>):
#   cmake -DFUZZER=... -DCORPUS=<seed dir> -DDICT=<.dict or empty>
#         -DWORK_DIR=<scratch dir> -DSECONDS=<n> -P run_fuzzer.cmake
# The seeds are copied into WORK_DIR/corpus, which the fuzzer may grow; crash
# reproducers are written to WORK_DIR/ (artifact_prefix). The seed directory
# in the source tree is never written to.
foreach(var FUZZER CORPUS WORK_DIR SECONDS)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_fuzzer.cmake: ${var} is not set")
  endif()
endforeach()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR}/corpus)
file(GLOB seeds LIST_DIRECTORIES false ${CORPUS}/*)
if(seeds)
  file(COPY ${seeds} DESTINATION ${WORK_DIR}/corpus)
endif()

set(args -max_total_time=${SECONDS} -rss_limit_mb=2048 -timeout=10 -malloc_limit_mb=1024
         -print_final_stats=1 -artifact_prefix=${WORK_DIR}/)
if(DICT)
  list(APPEND args -dict=${DICT})
endif()

execute_process(COMMAND ${FUZZER} ${args} ${WORK_DIR}/corpus
                WORKING_DIRECTORY ${WORK_DIR}
                RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${FUZZER} failed (${status}); reproducers are in ${WORK_DIR}/")
endif()
