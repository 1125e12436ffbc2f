// Renders a parsed chat template: runs its statements and evaluates its expressions with Python's
// semantics and Jinja's scoping (a for loop's body sets variables of its own; `namespace()` is how
// a loop hands values out).
#pragma once

#include <string>

#include "data/tokenizer/chat_template_ast.h"

namespace pipetrain::jinja {

// `variables` is a dict: the template's global variables.
std::string render(const Body& body, const Value& variables);

}  // namespace pipetrain::jinja
