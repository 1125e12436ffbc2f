// Splits a chat template into text and the tokens of its tags, as Python's Jinja lexer does with
// transformers' settings: trim_blocks and lstrip_blocks on, the template's one trailing newline
// dropped, `{%-`/`-%}` stripping whitespace, comments removed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer/chat_template_value.h"

namespace pipetrain::jinja {

struct Token {
  enum class Type {
    Text,           // template text outside tags, whitespace control already applied
    VariableBegin,  // {{
    VariableEnd,    // }}
    BlockBegin,     // {%
    BlockEnd,       // %}
    Name,
    String,    // value holds the literal's text, escapes resolved
    Integer,   // integer holds it
    Float,     // number holds it
    Operator,  // value: + - * / // % ** ~ == != < > <= >= = ( ) [ ] { } , . : |
    End,       // end of the template
  };
  Type type;
  std::string value;
  Position position;
  int64_t integer = 0;
  double number = 0;
};

std::vector<Token> tokenize(std::string_view source);

}  // namespace pipetrain::jinja
