// Where the command's generate reads Hugging Face folders from: the library's readers
// (hf_decoder.h, hf_gpt2.h), which its namespace sees as its own.
#pragma once

#include <pipetrain/hf_decoder.h>
#include <pipetrain/hf_gpt2.h>
