// See models/hf_decoder.h: the library's readers, under the name generate includes.
#pragma once

#include "models/hf_decoder.h"
