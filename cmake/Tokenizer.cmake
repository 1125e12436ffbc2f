# pipetrain_text: what the tokenizer (src/data/tokenizer*) is built with. PCRE2 for the
# pre-tokenizers' regular expressions (Unicode properties, JIT) and utf8proc for Unicode
# normalization: Debian's libpcre2-dev and libutf8proc-dev (scripts/setup installs them). A
# machine without them (the GPU image has neither header) still builds pipetrain; its tokenizer
# then refuses, naming the missing library, any tokenizer.json that needs one (the two files that
# include them, src/data/tokenizer/regex.cpp and unicode.cpp, ask __has_include).
find_path(PIPETRAIN_PCRE2_INCLUDE_DIR pcre2.h)
find_library(PIPETRAIN_PCRE2_LIBRARY pcre2-8)
find_path(PIPETRAIN_UTF8PROC_INCLUDE_DIR utf8proc.h)
find_library(PIPETRAIN_UTF8PROC_LIBRARY utf8proc)
add_library(pipetrain_text INTERFACE)
set(PIPETRAIN_TEXT_LIBRARIES "")
foreach(dependency PCRE2 UTF8PROC)
  if(PIPETRAIN_${dependency}_INCLUDE_DIR AND PIPETRAIN_${dependency}_LIBRARY)
    target_include_directories(pipetrain_text SYSTEM INTERFACE ${PIPETRAIN_${dependency}_INCLUDE_DIR})
    target_link_libraries(pipetrain_text INTERFACE ${PIPETRAIN_${dependency}_LIBRARY})
    list(APPEND PIPETRAIN_TEXT_LIBRARIES ${PIPETRAIN_${dependency}_LIBRARY})
  else()
    message(WARNING "${dependency} not found: pipetrain's tokenizer will refuse tokenizer.json "
                    "files that need it (Debian: apt install libpcre2-dev libutf8proc-dev, as "
                    "scripts/setup does)")
  endif()
endforeach()
