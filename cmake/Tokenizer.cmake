# pipetrain_text: what the tokenizer (src/data/tokenizer*) is built with. PCRE2 for the
# pre-tokenizers' regular expressions (Unicode properties, JIT) and utf8proc for Unicode
# normalization: Debian's libpcre2-dev and libutf8proc-dev (scripts/setup installs them).
find_path(PIPETRAIN_PCRE2_INCLUDE_DIR pcre2.h)
find_library(PIPETRAIN_PCRE2_LIBRARY pcre2-8)
find_path(PIPETRAIN_UTF8PROC_INCLUDE_DIR utf8proc.h)
find_library(PIPETRAIN_UTF8PROC_LIBRARY utf8proc)
foreach(found PIPETRAIN_PCRE2_INCLUDE_DIR PIPETRAIN_PCRE2_LIBRARY PIPETRAIN_UTF8PROC_INCLUDE_DIR
              PIPETRAIN_UTF8PROC_LIBRARY)
  if(NOT ${found})
    message(FATAL_ERROR "${found} not found: the tokenizer needs PCRE2 and utf8proc (Debian: "
                        "apt install libpcre2-dev libutf8proc-dev, as scripts/setup does), or "
                        "pass -D${found}=<path>")
  endif()
endforeach()
add_library(pipetrain_text INTERFACE)
target_include_directories(pipetrain_text SYSTEM INTERFACE ${PIPETRAIN_PCRE2_INCLUDE_DIR}
                                                           ${PIPETRAIN_UTF8PROC_INCLUDE_DIR})
target_link_libraries(pipetrain_text INTERFACE ${PIPETRAIN_PCRE2_LIBRARY}
                                               ${PIPETRAIN_UTF8PROC_LIBRARY})
