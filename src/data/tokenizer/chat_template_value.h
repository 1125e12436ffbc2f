// The values a chat template computes with, and the Python semantics Jinja gives them.
//
// transformers renders chat templates with Python's Jinja, so every operation here is Python's:
// str() of a float is its repr, True prints as "True", a string's length counts code points, a
// dict keeps its insertion order, and tojson is json.dumps. Values come from the JSON context the
// caller passes (messages, tools, ...) or from the template's own literals.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace pipetrain::jinja {

// Where a construct begins in the template source, 1-based, for error messages.
struct Position {
  int line = 1;
  int column = 1;
};

// A construct the renderer does not implement, or a template that is not valid Jinja: refused
// rather than rendered differently from transformers.
[[noreturn]] void refuse(Position position, const std::string& message);
// A template that fails on this context (raise_exception, a type error, an undefined variable's
// attribute): transformers fails there too.
[[noreturn]] void fail(Position position, const std::string& message);

class Value;
using List = std::vector<Value>;
struct Macro;  // a `{% macro %}` as a value (chat_template_renderer.cpp)
// Python's dict keeps insertion order; templates print tools with tojson, so the order shows.
using Dict = std::vector<std::pair<std::string, Value>>;

class Value {
 public:
  enum class Type { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Macro };

  // Undefined: a missing variable, key or attribute. `what` says which, for error messages.
  Value() = default;
  static Value undefined(std::string what);
  static Value none();
  Value(bool value);                                       // NOLINT: implicit, as Python's literals
  Value(int64_t value);                                    // NOLINT
  Value(int value) : Value(int64_t{value}) {}              // NOLINT
  Value(double value);                                     // NOLINT
  Value(std::string value);                                // NOLINT
  Value(const char* value) : Value(std::string(value)) {}  // NOLINT
  // Python's sequences that Jinja yields besides lists differ from them in what works: a tuple
  // equals no list, a generator (what map and select return) is always true and has no length,
  // a dict's views and generators cannot be indexed (Jinja's undefined) or dumped to JSON.
  enum class Sequence { List, Tuple, Range, Generator, DictItems, DictKeys, DictValues };
  static Value list(List items, Sequence kind = Sequence::List);
  static Value dict(Dict items);
  // A namespace() object: the one value a template may change (`set ns.attribute = ...`), shared
  // by every copy, as a Python object is.
  static Value make_namespace(Dict items);
  static Value macro(std::shared_ptr<const Macro> macro);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::Undefined; }
  bool is_none() const { return type_ == Type::None; }
  bool is_string() const { return type_ == Type::String; }
  // Python's bool is an int: True + 1 == 2.
  bool is_integral() const { return type_ == Type::Int || type_ == Type::Bool; }
  bool is_number() const { return is_integral() || type_ == Type::Float; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const;   // Int or Bool
  double as_float() const;  // any number
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const List& as_list() const { return *std::get<std::shared_ptr<List>>(data_); }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<Dict>>(data_); }  // or namespace
  Dict& namespace_attributes() const { return *std::get<std::shared_ptr<Dict>>(data_); }
  const Macro& as_macro() const { return *std::get<std::shared_ptr<const Macro>>(data_); }
  const std::string& undefined_what() const { return undefined_what_; }
  Sequence sequence() const { return sequence_; }
  // A list, tuple or range: what Python can index, slice, compare and (but a range) dump.
  bool is_indexable_sequence() const {
    return type_ == Type::List && (sequence_ == Sequence::List || sequence_ == Sequence::Tuple ||
                                   sequence_ == Sequence::Range);
  }

  // The value of `key` in a dict or namespace, null where absent.
  const Value* find(std::string_view key) const;

 private:
  Type type_ = Type::Undefined;
  std::variant<std::monostate, bool, int64_t, double, std::string, std::shared_ptr<List>,
               std::shared_ptr<Dict>, std::shared_ptr<const Macro>>
      data_;
  std::string undefined_what_;
  Sequence sequence_ = Sequence::List;
};

Value from_json(const nlohmann::ordered_json& json);

// Jinja's UndefinedError, for what an undefined value cannot do (its attributes, arithmetic).
[[noreturn]] void fail_undefined(const Value& value, Position position);

// Python's type name ("str", "int", "dict", "NoneType"), for error messages.
std::string type_name(const Value& value);

// Python's truth: empty strings, lists and dicts, 0, None and undefined are false.
bool truthy(const Value& value);
// Python's ==: 1 == 1.0 == True, lists and dicts element by element; undefined equals undefined.
bool equals(const Value& a, const Value& b);
// Python's <, for numbers, strings and lists; other types fail at `position`.
bool less(const Value& a, const Value& b, Position position);

// Python's str(), as Jinja prints a value: undefined prints nothing, None as "None", a float as
// its repr. A list or dict would print as its Python repr, which is not implemented: refused.
std::string to_str(const Value& value, Position position);
// Python's repr() of a float: the shortest digits that read back the same, "1.0", "1e+16".
std::string python_float_repr(double value);

// json.dumps(value, ensure_ascii, indent, separators, sort_keys), as transformers' tojson filter.
struct JsonStyle {
  std::optional<std::string> indent;  // none: one line
  bool ensure_ascii = false;
  std::optional<std::pair<std::string, std::string>> separators;  // item, key
  bool sort_keys = false;
};
std::string to_json(const Value& value, const JsonStyle& style, Position position);

// UTF-8 text as Python sees it, code point by code point. Invalid UTF-8 is refused: Python
// strings hold code points, so no rendering of it could be the reference's.
std::u32string decode_utf8(std::string_view text, Position position);
std::string encode_utf8(std::u32string_view text);
// Python's str.isspace() of one code point (what strip(), split() and trim remove).
bool is_python_space(char32_t c);

}  // namespace pipetrain::jinja
