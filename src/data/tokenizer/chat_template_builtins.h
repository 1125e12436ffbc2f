// The filters, tests, global functions and methods a chat template can call, with Python's and
// transformers' semantics. Anything else is refused by name.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/tokenizer/chat_template_value.h"

namespace pipetrain::jinja {

struct Arguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

// What the parser checks names against.
bool is_filter(std::string_view name);
bool is_test(std::string_view name);
bool is_global_function(std::string_view name);
bool is_method(std::string_view name);  // of some type: str, dict

Value apply_filter(const std::string& name, const Value& value, const Arguments& arguments,
                   Position position);
bool apply_test(const std::string& name, const Value& value, const Arguments& arguments,
                Position position);
Value call_global_function(const std::string& name, const Arguments& arguments, Position position);
// `object.name(arguments)`; refuses a method the object's type does not have here.
Value call_method(const Value& object, const std::string& name, const Arguments& arguments,
                  Position position);
// Whether `object.name` is a method of the object's Python type (a bound method, which the
// renderer refuses to use other than by calling it).
bool has_method(const Value& object, std::string_view name);

// Jinja's `object.name` and `object[key]`: a dict's key, a list's or string's index; missing
// ones are undefined, and an undefined object fails.
Value get_attribute(const Value& object, const std::string& name, Position position);
Value get_item(const Value& object, const Value& key, Position position);

}  // namespace pipetrain::jinja
