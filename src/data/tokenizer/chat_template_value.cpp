#include "data/tokenizer/chat_template_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "data/tokenizer/utf8.h"

namespace pipetrain::jinja {

namespace {

std::string where(Position position) {
  return "chat template line " + std::to_string(position.line) + ", column " +
         std::to_string(position.column) + ": ";
}

}  // namespace

void refuse(Position position, const std::string& message) {
  throw std::invalid_argument(where(position) + message);
}

void fail(Position position, const std::string& message) {
  throw std::runtime_error(where(position) + message);
}

void fail_undefined(const Value& value, Position position) {
  fail(position,
       value.undefined_what().empty() ? "the value is undefined" : value.undefined_what());
}

Value Value::undefined(std::string what) {
  Value value;
  value.undefined_what_ = std::move(what);
  return value;
}

Value Value::none() {
  Value value;
  value.type_ = Type::None;
  return value;
}

Value::Value(bool value) : type_(Type::Bool), data_(value) {}
Value::Value(int64_t value) : type_(Type::Int), data_(value) {}
Value::Value(double value) : type_(Type::Float), data_(value) {}
Value::Value(std::string value) : type_(Type::String), data_(std::move(value)) {}

Value Value::list(List items, Sequence kind) {
  Value value;
  value.type_ = Type::List;
  value.sequence_ = kind;
  value.data_ = std::make_shared<List>(std::move(items));
  return value;
}

Value Value::dict(Dict items) {
  Value value;
  value.type_ = Type::Dict;
  value.data_ = std::make_shared<Dict>(std::move(items));
  return value;
}

Value Value::make_namespace(Dict items) {
  Value value = dict(std::move(items));
  value.type_ = Type::Namespace;
  return value;
}

Value Value::macro(std::shared_ptr<const Macro> macro) {
  Value value;
  value.type_ = Type::Macro;
  value.data_ = std::move(macro);
  return value;
}

int64_t Value::as_int() const {
  return type_ == Type::Bool ? int64_t{as_bool()} : std::get<int64_t>(data_);
}

double Value::as_float() const {
  return type_ == Type::Float ? std::get<double>(data_) : static_cast<double>(as_int());
}

const Value* Value::find(std::string_view key) const {
  if (type_ != Type::Dict && type_ != Type::Namespace) return nullptr;
  for (const auto& [name, value] : as_dict()) {
    if (name == key) return &value;
  }
  return nullptr;
}

Value from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t number = json.get<uint64_t>();
      if (number > static_cast<uint64_t>(INT64_MAX)) {
        throw std::invalid_argument("chat template context: the integer " + std::to_string(number) +
                                    " does not fit 64 bits");
      }
      return Value(static_cast<int64_t>(number));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& item : json) items.push_back(from_json(item));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict items;
      for (const auto& [key, item] : json.items()) items.emplace_back(key, from_json(item));
      return Value::dict(std::move(items));
    }
    default:
      throw std::invalid_argument("chat template context: binary JSON values are not supported");
  }
}

std::string type_name(const Value& value) {
  switch (value.type()) {
    case Value::Type::Undefined:
      return "Undefined";
    case Value::Type::None:
      return "NoneType";
    case Value::Type::Bool:
      return "bool";
    case Value::Type::Int:
      return "int";
    case Value::Type::Float:
      return "float";
    case Value::Type::String:
      return "str";
    case Value::Type::List:
      switch (value.sequence()) {
        case Value::Sequence::List:
          return "list";
        case Value::Sequence::Tuple:
          return "tuple";
        case Value::Sequence::Range:
          return "range";
        case Value::Sequence::Generator:
          return "generator";
        case Value::Sequence::DictItems:
          return "dict_items";
        case Value::Sequence::DictKeys:
          return "dict_keys";
        case Value::Sequence::DictValues:
          return "dict_values";
      }
      return "list";
    case Value::Type::Dict:
      return "dict";
    case Value::Type::Namespace:
      return "Namespace";
    case Value::Type::Macro:
      return "Macro";
  }
  return "?";
}

bool truthy(const Value& value) {
  switch (value.type()) {
    case Value::Type::Undefined:
    case Value::Type::None:
      return false;
    case Value::Type::Bool:
      return value.as_bool();
    case Value::Type::Int:
      return value.as_int() != 0;
    case Value::Type::Float:
      return value.as_float() != 0.0;
    case Value::Type::String:
      return !value.as_string().empty();
    case Value::Type::List:  // a generator is an object, true however many items it yields
      return value.sequence() == Value::Sequence::Generator || !value.as_list().empty();
    case Value::Type::Dict:
      return !value.as_dict().empty();
    case Value::Type::Namespace:
    case Value::Type::Macro:
      return true;
  }
  return false;
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::Undefined:
    case Value::Type::None:
      return true;
    case Value::Type::String:
      return a.as_string() == b.as_string();
    case Value::Type::List:
      // A list equals no tuple; generators and dict views equal nothing here (Python compares
      // views as sets or by identity).
      if (a.sequence() != b.sequence() || !a.is_indexable_sequence()) return false;
      return std::equal(a.as_list().begin(), a.as_list().end(), b.as_list().begin(),
                        b.as_list().end(), equals);
    case Value::Type::Dict: {
      // Python's dicts are equal whatever their order.
      if (a.as_dict().size() != b.as_dict().size()) return false;
      for (const auto& [key, item] : a.as_dict()) {
        const Value* other = b.find(key);
        if (!other || !equals(item, *other)) return false;
      }
      return true;
    }
    case Value::Type::Namespace:  // Python compares objects by identity
      return &a.namespace_attributes() == &b.namespace_attributes();
    case Value::Type::Macro:
      return &a.as_macro() == &b.as_macro();
    default:
      return false;
  }
}

bool less(const Value& a, const Value& b, Position position) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int();
    return a.as_float() < b.as_float();
  }
  // UTF-8's byte order is its code points' order, which is Python's.
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_indexable_sequence() && b.is_indexable_sequence() && a.sequence() == b.sequence() &&
      a.sequence() != Value::Sequence::Range) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return less(x[i], y[i], position);
    }
    return x.size() < y.size();
  }
  fail(position,
       "'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // The shortest digits that read back as the same double, as Python's repr chooses them.
  char buffer[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof buffer, "%.*e", precision - 1, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  // buffer is "-d.ddde+XX": split it into sign, digits and decimal exponent.
  std::string scientific = buffer;
  const size_t e = scientific.find('e');
  const int exponent = std::atoi(scientific.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i) {
    if (std::isdigit(static_cast<unsigned char>(scientific[i]))) digits += scientific[i];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const std::string sign = value < 0 || (value == 0 && std::signbit(value)) ? "-" : "";
  // Python's repr writes an exponent below 1e-4 and from 1e16 on.
  if (exponent < -4 || exponent >= 16) {
    std::string mantissa = digits.substr(0, 1);
    if (digits.size() > 1) mantissa += "." + digits.substr(1);
    char exponent_text[16];
    std::snprintf(exponent_text, sizeof exponent_text, "e%c%02d", exponent < 0 ? '-' : '+',
                  std::abs(exponent));
    return sign + mantissa + exponent_text;
  }
  if (exponent < 0) return sign + "0." + std::string(-exponent - 1, '0') + digits;
  const size_t integer_digits = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= integer_digits) {
    return sign + digits + std::string(integer_digits - digits.size(), '0') + ".0";
  }
  return sign + digits.substr(0, integer_digits) + "." + digits.substr(integer_digits);
}

std::string to_str(const Value& value, Position position) {
  switch (value.type()) {
    case Value::Type::Undefined:
      return "";
    case Value::Type::None:
      return "None";
    case Value::Type::Bool:
      return value.as_bool() ? "True" : "False";
    case Value::Type::Int:
      return std::to_string(value.as_int());
    case Value::Type::Float:
      return python_float_repr(value.as_float());
    case Value::Type::String:
      return value.as_string();
    default:
      refuse(position, "printing a " + type_name(value) +
                           " (Python's repr of it) is not supported; use tojson");
  }
}

namespace {

// "\u" and four lowercase hex digits, as json.dumps writes an escaped code unit.
void append_hex4(std::string& out, unsigned code) {
  static const char kDigits[] = "0123456789abcdef";
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += kDigits[(code >> shift) & 0xf];
}

// json.dumps' string: the escapes of its ESCAPE (or ESCAPE_ASCII) table.
void append_json_string(std::string& out, const std::string& text, bool ensure_ascii,
                        Position position) {
  out += '"';
  if (ensure_ascii) {
    for (char32_t c : decode_utf8(text, position)) {
      if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
        out += static_cast<char>(c);
      } else if (c == '"' || c == '\\') {
        out += '\\';
        out += static_cast<char>(c);
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c == '\b') {
        out += "\\b";
      } else if (c == '\f') {
        out += "\\f";
      } else if (c > 0xffff) {  // a surrogate pair, as Python writes it
        const unsigned v = static_cast<unsigned>(c) - 0x10000;
        append_hex4(out, 0xd800 | (v >> 10));
        append_hex4(out, 0xdc00 | (v & 0x3ff));
      } else {
        append_hex4(out, static_cast<unsigned>(c));
      }
    }
  } else {
    for (char c : text) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            append_hex4(out, static_cast<unsigned char>(c));
          } else {
            out += c;
          }
      }
    }
  }
  out += '"';
}

void append_json(std::string& out, const Value& value, const JsonStyle& style, int depth,
                 Position position) {
  const std::string item_separator =
      style.separators ? style.separators->first : (style.indent ? "," : ", ");
  const std::string key_separator = style.separators ? style.separators->second : ": ";
  // With an indent each item goes on a line of its own, the closing bracket on the parent's.
  auto newline = [&](int level) {
    if (!style.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += *style.indent;
  };
  // `count` items between brackets, each written by `append_item(i)`; "[]" or "{}" when empty.
  auto append_items = [&](size_t count, char open, char close, const auto& append_item) {
    out += open;
    for (size_t i = 0; i < count; ++i) {
      if (i > 0) out += item_separator;
      newline(depth + 1);
      append_item(i);
    }
    if (count > 0) newline(depth);
    out += close;
  };
  switch (value.type()) {
    case Value::Type::None:
      out += "null";
      return;
    case Value::Type::Bool:
      out += value.as_bool() ? "true" : "false";
      return;
    case Value::Type::Int:
      out += std::to_string(value.as_int());
      return;
    case Value::Type::Float: {
      const double number = value.as_float();
      if (std::isnan(number)) {
        out += "NaN";
      } else if (std::isinf(number)) {
        out += number < 0 ? "-Infinity" : "Infinity";
      } else {
        out += python_float_repr(number);
      }
      return;
    }
    case Value::Type::String:
      append_json_string(out, value.as_string(), style.ensure_ascii, position);
      return;
    case Value::Type::List: {
      if (value.sequence() != Value::Sequence::List && value.sequence() != Value::Sequence::Tuple) {
        fail(position, "Object of type " + type_name(value) + " is not JSON serializable");
      }
      const List& items = value.as_list();
      append_items(items.size(), '[', ']',
                   [&](size_t i) { append_json(out, items[i], style, depth + 1, position); });
      return;
    }
    case Value::Type::Dict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : value.as_dict()) items.push_back(&item);
      if (style.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      append_items(items.size(), '{', '}', [&](size_t i) {
        append_json_string(out, items[i]->first, style.ensure_ascii, position);
        out += key_separator;
        append_json(out, items[i]->second, style, depth + 1, position);
      });
      return;
    }
    default:
      fail(position, "Object of type " + type_name(value) + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& value, const JsonStyle& style, Position position) {
  std::string out;
  append_json(out, value, style, 0, position);
  return out;
}

std::u32string decode_utf8(std::string_view text, Position position) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    int length = 0;
    char32_t code = 0;
    if (byte < 0x80) {
      length = 1;
      code = byte;
    } else if ((byte & 0xe0) == 0xc0) {
      length = 2;
      code = byte & 0x1f;
    } else if ((byte & 0xf0) == 0xe0) {
      length = 3;
      code = byte & 0x0f;
    } else if ((byte & 0xf8) == 0xf0) {
      length = 4;
      code = byte & 0x07;
    }
    bool valid = length > 0 && i + length <= text.size();
    for (int k = 1; valid && k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      valid = (next & 0xc0) == 0x80;
      code = (code << 6) | (next & 0x3f);
    }
    static constexpr char32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    valid = valid && code >= kSmallest[length] && code <= 0x10ffff &&
            !(code >= 0xd800 && code <= 0xdfff);
    if (!valid) {
      fail(position, "invalid UTF-8 at byte " + std::to_string(i) + " of a string");
    }
    out += code;
    i += length;
  }
  return out;
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char32_t c : text) tokenizer::append_utf8(out, c);
  return out;
}

bool is_python_space(char32_t c) {
  // The code points whose Unicode bidirectional type is WS, B or S, or whose category is Zs:
  // CPython's Py_UNICODE_ISSPACE.
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

}  // namespace pipetrain::jinja
