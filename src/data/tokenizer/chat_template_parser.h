// Parses a chat template's tokens into statements, with Jinja's grammar and operator precedence.
// Statements, filters, tests, functions and methods the renderer does not implement are refused
// here, naming the construct and its position, so that a template is known to be renderable
// before any conversation is.
#pragma once

#include <vector>

#include "data/tokenizer/chat_template_ast.h"
#include "data/tokenizer/chat_template_lexer.h"

namespace pipetrain::jinja {

Body parse(const std::vector<Token>& tokens);

}  // namespace pipetrain::jinja
