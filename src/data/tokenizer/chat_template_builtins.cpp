#include "data/tokenizer/chat_template_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <initializer_list>
#include <optional>

namespace pipetrain::jinja {

namespace {

bool one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Python's own methods of str, dict and list, implemented here or not: Jinja's `x.name` gives a
// bound method where the type has one, so such a name never reads a dict's key.
bool is_python_method(const Value& value, std::string_view name) {
  switch (value.type()) {
    case Value::Type::String:
      return one_of(
          name,
          {"capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
           "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
           "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
           "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
           "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
           "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
           "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
           "swapcase",     "title",       "translate", "upper",      "zfill"});
    case Value::Type::Dict:
      return one_of(name, {"clear", "copy", "fromkeys", "get", "items", "keys", "pop", "popitem",
                           "setdefault", "update", "values"});
    case Value::Type::List:
      return one_of(name, {"append", "clear", "copy", "count", "extend", "index", "insert", "pop",
                           "remove", "reverse", "sort"});
    default:
      return false;
  }
}

// Python's rules for binding arguments to a signature: the parameters in order, by position or
// keyword; an unknown keyword or one too many is refused, as Python raises.
std::vector<std::optional<Value>> bind(const Arguments& arguments,
                                       std::initializer_list<std::string_view> parameters,
                                       const std::string& what, Position position) {
  std::vector<std::optional<Value>> bound(parameters.size());
  if (arguments.positional.size() > parameters.size()) {
    fail(position, what + " takes at most " + std::to_string(parameters.size()) +
                       " arguments, given " + std::to_string(arguments.positional.size()));
  }
  for (size_t i = 0; i < arguments.positional.size(); ++i) bound[i] = arguments.positional[i];
  for (const auto& [keyword, value] : arguments.keywords) {
    const auto found = std::find(parameters.begin(), parameters.end(), keyword);
    if (found == parameters.end()) {
      refuse(position, what + ": the argument '" + keyword + "' is not supported");
    }
    bound[found - parameters.begin()] = value;
  }
  return bound;
}

const std::string& require_string(const Value& value, const std::string& what, Position position) {
  if (!value.is_string()) {
    fail(position, what + " expects a str, not '" + type_name(value) + "'");
  }
  return value.as_string();
}

// Python's str case mappings cover all of Unicode; these are ASCII's, so other text is refused
// rather than mapped differently.
std::string ascii_case(const std::string& text, const std::string& method, Position position) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      refuse(position, "'" + method + "' of non-ASCII text is not supported");
    }
  }
  std::string out = text;
  bool previous_cased = false;
  for (size_t i = 0; i < out.size(); ++i) {
    const auto c = static_cast<unsigned char>(out[i]);
    if (method == "upper") {
      out[i] = static_cast<char>(std::toupper(c));
    } else if (method == "lower") {
      out[i] = static_cast<char>(std::tolower(c));
    } else if (method == "capitalize") {
      out[i] = static_cast<char>(i == 0 ? std::toupper(c) : std::tolower(c));
    } else {  // title: a letter after a letter is lower case, any other upper case
      out[i] = static_cast<char>(previous_cased ? std::tolower(c) : std::toupper(c));
      previous_cased = std::isalpha(c) != 0;
    }
  }
  return out;
}

// str.strip / lstrip / rstrip, of whitespace or of the code points of `chars`.
std::string strip(const std::string& text, const std::optional<Value>& chars, bool left, bool right,
                  Position position) {
  const std::u32string code_points = decode_utf8(text, position);
  std::u32string set;
  const bool whitespace = !chars || chars->is_none();
  if (!whitespace) set = decode_utf8(require_string(*chars, "strip", position), position);
  auto stripped = [&](char32_t c) {
    return whitespace ? is_python_space(c) : set.find(c) != std::u32string::npos;
  };
  size_t begin = 0;
  size_t end = code_points.size();
  while (left && begin < end && stripped(code_points[begin])) ++begin;
  while (right && end > begin && stripped(code_points[end - 1])) --end;
  return encode_utf8(std::u32string_view(code_points).substr(begin, end - begin));
}

// str.split and str.rsplit: by `separator`, or by runs of whitespace where it is None.
List split(const std::string& text, const std::optional<Value>& separator,
           const std::optional<Value>& max_split_value, bool from_right, Position position) {
  int64_t max_split = -1;
  if (max_split_value) {
    if (!max_split_value->is_integral()) fail(position, "split's maxsplit must be an int");
    max_split = max_split_value->as_int();
  }
  std::vector<std::string> parts;
  if (!separator || separator->is_none()) {
    const std::u32string code_points = decode_utf8(text, position);
    std::vector<std::u32string> words;
    // Scan from the end for rsplit, so that the unsplit remainder is the text's beginning.
    std::u32string source = code_points;
    if (from_right) std::reverse(source.begin(), source.end());
    size_t i = 0;
    while (true) {
      while (i < source.size() && is_python_space(source[i])) ++i;
      if (i == source.size()) break;
      if (max_split >= 0 && static_cast<int64_t>(words.size()) == max_split) {
        words.push_back(source.substr(i));  // the rest, its trailing whitespace kept
        break;
      }
      size_t end = i;
      while (end < source.size() && !is_python_space(source[end])) ++end;
      words.push_back(source.substr(i, end - i));
      i = end;
    }
    if (from_right) {
      std::reverse(words.begin(), words.end());
      for (auto& word : words) std::reverse(word.begin(), word.end());
    }
    for (const auto& word : words) parts.push_back(encode_utf8(word));
  } else {
    const std::string& sep = require_string(*separator, "split", position);
    if (sep.empty()) fail(position, "split: empty separator");
    if (!from_right) {
      size_t start = 0;
      while (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) {
        const size_t found = text.find(sep, start);
        if (found == std::string::npos) break;
        parts.push_back(text.substr(start, found - start));
        start = found + sep.size();
      }
      parts.push_back(text.substr(start));
    } else {
      size_t end = text.size();
      while (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) {
        if (end < sep.size()) break;
        const size_t found = text.rfind(sep, end - sep.size());
        if (found == std::string::npos) break;
        parts.push_back(text.substr(found + sep.size(), end - found - sep.size()));
        end = found;
      }
      parts.push_back(text.substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
  }
  List items;
  for (auto& part : parts) items.emplace_back(std::move(part));
  return items;
}

// str.replace(old, new, count): an empty `old` inserts `new` between code points, as Python does.
std::string replace(const std::string& text, const std::string& old, const std::string& with,
                    int64_t count, Position position) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    const std::u32string code_points = decode_utf8(text, position);
    for (char32_t c : code_points) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      out += encode_utf8(std::u32string(1, c));
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    const size_t found = text.find(old, start);
    if (found == std::string::npos) break;
    out.append(text, start, found - start);
    out += with;
    start = found + old.size();
    ++done;
  }
  out.append(text, start, std::string::npos);
  return out;
}

bool starts_or_ends_with(const std::string& text, const Value& affixes, bool start,
                         Position position) {
  auto matches = [&](const Value& affix) {
    const std::string& a = require_string(affix, start ? "startswith" : "endswith", position);
    if (a.size() > text.size()) return false;
    return start ? text.compare(0, a.size(), a) == 0
                 : text.compare(text.size() - a.size(), a.size(), a) == 0;
  };
  if (affixes.type() == Value::Type::List) {
    if (affixes.sequence() != Value::Sequence::Tuple) {
      fail(position, std::string(start ? "startswith" : "endswith") +
                         " first arg must be str or a tuple of str, not " + type_name(affixes));
    }
    return std::any_of(affixes.as_list().begin(), affixes.as_list().end(), matches);
  }
  return matches(affixes);
}

// Python's iter(): the items of a list, the keys of a dict, the code points of a str; undefined
// iterates as empty.
List iterate(const Value& value, Position position) {
  switch (value.type()) {
    case Value::Type::Undefined:
      return {};
    case Value::Type::List:
      return value.as_list();
    case Value::Type::Dict: {
      List keys;
      for (const auto& item : value.as_dict()) keys.emplace_back(item.first);
      return keys;
    }
    case Value::Type::String: {
      List characters;
      for (char32_t c : decode_utf8(value.as_string(), position)) {
        characters.emplace_back(encode_utf8(std::u32string(1, c)));
      }
      return characters;
    }
    default:
      fail(position, "'" + type_name(value) + "' object is not iterable");
  }
}

int64_t length(const Value& value, Position position) {
  switch (value.type()) {
    case Value::Type::Undefined:
      return 0;
    case Value::Type::String:
      return static_cast<int64_t>(decode_utf8(value.as_string(), position).size());
    case Value::Type::List:
      if (value.sequence() == Value::Sequence::Generator) {
        fail(position, "object of type 'generator' has no len()");
      }
      return static_cast<int64_t>(value.as_list().size());
    case Value::Type::Dict:
      return static_cast<int64_t>(value.as_dict().size());
    default:
      fail(position, "object of type '" + type_name(value) + "' has no len()");
  }
}

// Jinja's attribute getter of map, selectattr and sort: "a.b.0" looks up a, then b, then item 0.
Value get_path(const Value& item, const Value& path, Position position) {
  if (path.is_integral()) return get_item(item, path, position);
  const std::string& text = require_string(path, "attribute", position);
  Value current = item;
  size_t start = 0;
  while (true) {
    const size_t dot = text.find('.', start);
    const std::string part = text.substr(start, dot == std::string::npos ? dot : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    current = get_item(current, digits ? Value(int64_t{std::stoll(part)}) : Value(part), position);
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

// select, reject, selectattr, rejectattr: the items whose (attribute's) test passes, or fails.
Value select(const std::string& filter, const Value& value, const Arguments& arguments,
             Position position) {
  const bool by_attribute = filter == "selectattr" || filter == "rejectattr";
  const bool keep = filter == "select" || filter == "selectattr";
  if (!arguments.keywords.empty()) refuse(position, filter + " takes no keyword arguments");
  size_t next = 0;
  Value attribute;
  if (by_attribute) {
    if (arguments.positional.empty()) fail(position, filter + " needs an attribute");
    attribute = arguments.positional[next++];
  }
  std::string test;
  if (next < arguments.positional.size()) {
    test = require_string(arguments.positional[next++], filter + "'s test", position);
    if (!is_test(test)) refuse(position, "the test '" + test + "' is not supported");
  }
  Arguments test_arguments;
  test_arguments.positional.assign(arguments.positional.begin() + next, arguments.positional.end());
  List kept;
  for (const Value& item : iterate(value, position)) {
    const Value tested = by_attribute ? get_path(item, attribute, position) : item;
    const bool passes =
        test.empty() ? truthy(tested) : apply_test(test, tested, test_arguments, position);
    if (passes == keep) kept.push_back(item);
  }
  return Value::list(std::move(kept), Value::Sequence::Generator);
}

Value map(const Value& value, const Arguments& arguments, Position position) {
  List mapped;
  if (arguments.positional.empty()) {  // map(attribute='name', default=...)
    const auto bound = bind(arguments, {"attribute", "default"}, "map", position);
    if (!bound[0]) fail(position, "map needs a filter name or attribute=");
    for (const Value& item : iterate(value, position)) {
      Value result = get_path(item, *bound[0], position);
      if (result.is_undefined() && bound[1]) result = *bound[1];
      mapped.push_back(std::move(result));
    }
  } else {  // map('filter', arguments...)
    const std::string& filter = require_string(arguments.positional[0], "map", position);
    if (!is_filter(filter)) refuse(position, "the filter '" + filter + "' is not supported");
    Arguments rest{{arguments.positional.begin() + 1, arguments.positional.end()},
                   arguments.keywords};
    for (const Value& item : iterate(value, position)) {
      mapped.push_back(apply_filter(filter, item, rest, position));
    }
  }
  return Value::list(std::move(mapped), Value::Sequence::Generator);
}

// Python's int() of a filter's input, or the default where it cannot convert.
Value to_int(const Value& value, const Value& fallback) {
  if (value.is_integral()) return Value(value.as_int());
  if (value.type() == Value::Type::Float) {
    const double number = value.as_float();
    if (!std::isfinite(number) || std::fabs(number) >= 9.2e18) return fallback;
    return Value(static_cast<int64_t>(number));
  }
  if (value.is_string()) {
    const std::string text = value.as_string();
    char* end = nullptr;
    errno = 0;
    const long long integer = std::strtoll(text.c_str(), &end, 10);
    auto only_space_after = [&](const char* p) {
      while (*p && std::isspace(static_cast<unsigned char>(*p))) ++p;
      return *p == '\0';
    };
    if (end != text.c_str() && errno == 0 && only_space_after(end)) return Value(int64_t{integer});
    // Jinja's int filter falls back to float(): "3.7" is 3.
    const double number = std::strtod(text.c_str(), &end);
    if (end != text.c_str() && only_space_after(end) && std::isfinite(number)) {
      return Value(static_cast<int64_t>(number));
    }
  }
  return fallback;
}

Value to_float(const Value& value, const Value& fallback) {
  if (value.is_number()) return Value(value.as_float());
  if (value.is_string()) {
    const std::string& text = value.as_string();
    char* end = nullptr;
    const double number = std::strtod(text.c_str(), &end);
    while (end && *end && std::isspace(static_cast<unsigned char>(*end))) ++end;
    if (end != text.c_str() && *end == '\0') return Value(number);
  }
  return fallback;
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False).
Value tojson(const Value& value, const Arguments& arguments, Position position) {
  const auto bound =
      bind(arguments, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson", position);
  JsonStyle style;
  if (bound[0]) style.ensure_ascii = truthy(*bound[0]);
  if (bound[1] && !bound[1]->is_none()) {
    if (bound[1]->is_integral()) {
      style.indent =
          std::string(static_cast<size_t>(std::max<int64_t>(0, bound[1]->as_int())), ' ');
    } else if (bound[1]->is_string()) {
      style.indent = bound[1]->as_string();
    } else {
      fail(position, "tojson's indent must be an int or a str");
    }
  }
  if (bound[2] && !bound[2]->is_none()) {
    const Value& separators = *bound[2];
    if (!separators.is_indexable_sequence() || separators.as_list().size() != 2) {
      fail(position, "tojson's separators must be a pair of str");
    }
    style.separators =
        std::make_pair(require_string(separators.as_list()[0], "tojson's separators", position),
                       require_string(separators.as_list()[1], "tojson's separators", position));
  }
  if (bound[3]) style.sort_keys = truthy(*bound[3]);
  return Value(to_json(value, style, position));
}

}  // namespace

bool is_filter(std::string_view name) {
  return one_of(name,
                {"abs",        "capitalize", "count",      "d",       "default", "first", "float",
                 "int",        "items",      "join",       "last",    "length",  "list",  "lower",
                 "map",        "reject",     "rejectattr", "replace", "reverse", "safe",  "select",
                 "selectattr", "string",     "tojson",     "trim",    "upper"});
}

bool is_test(std::string_view name) {
  return one_of(name, {"defined",  "undefined", "none",   "boolean",     "true",     "false",
                       "integer",  "float",     "number", "string",      "mapping",  "iterable",
                       "sequence", "odd",       "even",   "divisibleby", "eq",       "equalto",
                       "==",       "ne",        "!=",     "lt",          "lessthan", "<",
                       "le",       "<=",        "gt",     "greaterthan", ">",        "ge",
                       ">=",       "in",        "sameas"});
}

bool is_global_function(std::string_view name) {
  return one_of(name, {"raise_exception", "namespace", "range", "dict", "strftime_now"});
}

bool is_method(std::string_view name) {
  return one_of(name, {"startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip",
                       "replace", "upper", "lower", "capitalize", "title", "find", "join", "items",
                       "keys", "values", "get"});
}

bool has_method(const Value& object, std::string_view name) {
  return is_python_method(object, name);
}

Value get_attribute(const Value& object, const std::string& name, Position position) {
  if (object.is_undefined()) {
    fail_undefined(object, position);
  }
  if (is_python_method(object, name)) {
    const std::string key = "['" + name + "']";
    refuse(position, "the method '" + name + "' of a " + type_name(object) +
                         " used without calling it (a dict's key of that name is read with " + key +
                         ")");
  }
  if (const Value* found = object.find(name)) return *found;
  return Value::undefined("'" + type_name(object) + " object' has no attribute '" + name + "'");
}

Value get_item(const Value& object, const Value& key, Position position) {
  if (object.is_undefined()) {
    fail_undefined(object, position);
  }
  if (key.is_string()) {
    if (const Value* found = object.find(key.as_string())) return *found;
    // Jinja falls back to the attribute: a method, which is only usable by calling it.
    if (is_python_method(object, key.as_string()))
      return get_attribute(object, key.as_string(), position);
    return Value::undefined("'" + type_name(object) + " object' has no attribute '" +
                            key.as_string() + "'");
  }
  // Generators and dict views cannot be indexed: Jinja's undefined.
  if (key.is_integral() && (object.is_indexable_sequence() || object.is_string())) {
    const List items = object.is_string() ? iterate(object, position) : List{};
    const List& sequence = object.is_string() ? items : object.as_list();
    int64_t index = key.as_int();
    if (index < 0) index += static_cast<int64_t>(sequence.size());
    if (index >= 0 && index < static_cast<int64_t>(sequence.size())) return sequence[index];
  }
  return Value::undefined("'" + type_name(object) + " object' has no item " +
                          (key.is_number() ? to_str(key, position) : "of type " + type_name(key)));
}

Value apply_filter(const std::string& name, const Value& value, const Arguments& arguments,
                   Position position) {
  const std::string what = "the filter '" + name + "'";
  if (name == "trim") {
    const auto bound = bind(arguments, {"chars"}, what, position);
    return Value(strip(to_str(value, position), bound[0], true, true, position));
  }
  if (name == "length" || name == "count") {
    bind(arguments, {}, what, position);
    return Value(length(value, position));
  }
  if (name == "tojson") return tojson(value, arguments, position);
  if (name == "string" || name == "safe") {
    bind(arguments, {}, what, position);
    return Value(to_str(value, position));
  }
  if (name == "lower" || name == "upper" || name == "capitalize") {
    bind(arguments, {}, what, position);
    return Value(ascii_case(to_str(value, position), name, position));
  }
  if (name == "default" || name == "d") {
    const auto bound = bind(arguments, {"default_value", "boolean"}, what, position);
    const bool use_default =
        value.is_undefined() || (bound[1] && truthy(*bound[1]) && !truthy(value));
    if (!use_default) return value;
    return bound[0] ? *bound[0] : Value(std::string());
  }
  if (name == "first" || name == "last") {
    bind(arguments, {}, what, position);
    if (name == "last" && value.type() == Value::Type::List &&
        value.sequence() == Value::Sequence::Generator) {
      fail(position, "'" + type_name(value) + "' object is not reversible");
    }
    const List items = iterate(value, position);
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const auto bound = bind(arguments, {"d", "attribute"}, what, position);
    const std::string separator = bound[0] ? to_str(*bound[0], position) : "";
    std::string out;
    bool first = true;
    for (const Value& item : iterate(value, position)) {
      if (!first) out += separator;
      first = false;
      out += to_str(bound[1] ? get_path(item, *bound[1], position) : item, position);
    }
    return Value(std::move(out));
  }
  if (name == "list") {
    bind(arguments, {}, what, position);
    return Value::list(iterate(value, position));
  }
  if (name == "reverse") {
    bind(arguments, {}, what, position);
    if (value.is_string()) {
      std::u32string code_points = decode_utf8(value.as_string(), position);
      std::reverse(code_points.begin(), code_points.end());
      return Value(encode_utf8(code_points));
    }
    // Jinja returns reversed(value), an iterator, or a list where value is a generator.
    List items = iterate(value, position);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items), value.sequence() == Value::Sequence::Generator
                                             ? Value::Sequence::List
                                             : Value::Sequence::Generator);
  }
  if (name == "items") {
    bind(arguments, {}, what, position);
    // A generator of (key, value) tuples.
    List pairs;
    if (!value.is_undefined()) {
      if (value.type() != Value::Type::Dict)
        fail(position, "Can only get item pairs from a mapping.");
      for (const auto& [key, item] : value.as_dict()) {
        pairs.push_back(Value::list({key, item}, Value::Sequence::Tuple));
      }
    }
    return Value::list(std::move(pairs), Value::Sequence::Generator);
  }
  if (name == "replace") {
    const auto bound = bind(arguments, {"old", "new", "count"}, what, position);
    if (!bound[0] || !bound[1]) fail(position, "replace needs old and new");
    const int64_t count = bound[2] && !bound[2]->is_none() ? bound[2]->as_int() : -1;
    return Value(replace(to_str(value, position), to_str(*bound[0], position),
                         to_str(*bound[1], position), count, position));
  }
  // int() and float() of undefined fail, as Jinja's Undefined.__int__ does.
  if ((name == "int" || name == "float") && value.is_undefined()) {
    fail_undefined(value, position);
  }
  if (name == "int") {
    const auto bound = bind(arguments, {"default"}, what, position);
    return to_int(value, bound[0] ? *bound[0] : Value(int64_t{0}));
  }
  if (name == "float") {
    const auto bound = bind(arguments, {"default"}, what, position);
    return to_float(value, bound[0] ? *bound[0] : Value(0.0));
  }
  if (name == "abs") {
    bind(arguments, {}, what, position);
    if (value.is_integral()) return Value(value.as_int() < 0 ? -value.as_int() : value.as_int());
    if (value.is_number()) return Value(std::fabs(value.as_float()));
    fail(position, "bad operand type for abs(): '" + type_name(value) + "'");
  }
  if (name == "map") return map(value, arguments, position);
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return select(name, value, arguments, position);
  }
  refuse(position, what + " is not supported");
}

bool apply_test(const std::string& name, const Value& value, const Arguments& arguments,
                Position position) {
  const std::string what = "the test '" + name + "'";
  // The one argument of a comparison test (`x is eq 1`).
  auto other = [&]() -> const Value& {
    bind(arguments, {"other"}, what, position);  // refuses other keywords, extra arguments
    if (arguments.positional.empty() && arguments.keywords.empty()) {
      fail(position, what + " needs an argument");
    }
    return arguments.positional.empty() ? arguments.keywords[0].second : arguments.positional[0];
  };
  using Type = Value::Type;
  const Type type = value.type();
  if (name == "defined") return type != Type::Undefined;
  if (name == "undefined") return type == Type::Undefined;
  if (name == "none") return type == Type::None;
  if (name == "boolean") return type == Type::Bool;
  if (name == "true") return type == Type::Bool && value.as_bool();
  if (name == "false") return type == Type::Bool && !value.as_bool();
  if (name == "integer") return type == Type::Int;
  if (name == "float") return type == Type::Float;
  if (name == "number") return value.is_number();  // Python's bool is a number
  if (name == "string") return type == Type::String;
  if (name == "mapping") return type == Type::Dict;
  // Jinja's undefined iterates (as empty) and has a length; a sequence has a length and items.
  if (name == "iterable") {
    return type == Type::String || type == Type::List || type == Type::Dict ||
           type == Type::Undefined;
  }
  if (name == "sequence") {
    return type == Type::String || value.is_indexable_sequence() || type == Type::Dict ||
           type == Type::Undefined;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    // value % 2 == 1, value % 2 == 0, value % num == 0, with Python's modulo.
    const Value divisor = name == "divisibleby" ? other() : Value(int64_t{2});
    if (!value.is_number() || !divisor.is_number()) {
      fail(position, what + " expects numbers, not '" + type_name(value) + "'");
    }
    if (divisor.as_float() == 0) fail(position, "integer division or modulo by zero");
    double remainder;
    if (value.is_integral() && divisor.is_integral()) {
      const int64_t d = divisor.as_int();
      remainder = static_cast<double>(((value.as_int() % d) + d) % d);
    } else {
      const double d = divisor.as_float();
      remainder = std::fmod(value.as_float(), d);
      if (remainder != 0 && ((remainder < 0) != (d < 0))) remainder += d;
    }
    return name == "odd" ? remainder == 1 : remainder == 0;
  }
  if (one_of(name, {"eq", "equalto", "=="})) return equals(value, other());
  if (one_of(name, {"ne", "!="})) return !equals(value, other());
  if (one_of(name, {"lt", "lessthan", "<"})) return less(value, other(), position);
  if (one_of(name, {"le", "<="})) return !less(other(), value, position);
  if (one_of(name, {"gt", "greaterthan", ">"})) return less(other(), value, position);
  if (one_of(name, {"ge", ">="})) return !less(value, other(), position);
  if (name == "in") {
    const Value& container = other();
    if (container.is_string()) {
      return container.as_string().find(require_string(value, "in", position)) != std::string::npos;
    }
    for (const Value& item : iterate(container, position)) {
      if (equals(item, value)) return true;
    }
    return false;
  }
  if (name == "sameas") {
    // Python's `is`: well defined for None, True and False only.
    const Value& b = other();
    const bool singletons = (type == Type::None || type == Type::Bool) ||
                            (b.type() == Type::None || b.type() == Type::Bool);
    if (!singletons) refuse(position, "'sameas' of values other than none, true and false");
    return type == b.type() && (type == Type::None || value.as_bool() == b.as_bool());
  }
  refuse(position, what + " is not supported");
}

Value call_global_function(const std::string& name, const Arguments& arguments, Position position) {
  if (name == "raise_exception") {
    const auto bound = bind(arguments, {"message"}, name, position);
    fail(position, "the template raised an exception: " +
                       (bound[0] ? to_str(*bound[0], position) : std::string()));
  }
  if (name == "namespace" || name == "dict") {
    Dict attributes;
    if (arguments.positional.size() > 1) fail(position, name + " takes at most one dict");
    auto assign = [&](const std::string& key, const Value& item) {
      for (auto& [existing, value] : attributes) {
        if (existing == key) {
          value = item;
          return;
        }
      }
      attributes.emplace_back(key, item);
    };
    if (!arguments.positional.empty()) {
      if (arguments.positional[0].type() != Value::Type::Dict) {
        fail(position, name + "'s positional argument must be a dict");
      }
      for (const auto& [key, item] : arguments.positional[0].as_dict()) assign(key, item);
    }
    for (const auto& [key, item] : arguments.keywords) assign(key, item);
    return name == "dict" ? Value::dict(std::move(attributes))
                          : Value::make_namespace(std::move(attributes));
  }
  if (name == "range") {
    if (!arguments.keywords.empty() || arguments.positional.empty() ||
        arguments.positional.size() > 3) {
      fail(position, "range takes one to three positional arguments");
    }
    for (const Value& argument : arguments.positional) {
      if (!argument.is_integral()) fail(position, "range's arguments must be ints");
    }
    const auto& a = arguments.positional;
    const int64_t start = a.size() == 1 ? 0 : a[0].as_int();
    const int64_t stop = a.size() == 1 ? a[0].as_int() : a[1].as_int();
    const int64_t step = a.size() == 3 ? a[2].as_int() : 1;
    if (step == 0) fail(position, "range() arg 3 must not be zero");
    List numbers;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      // Jinja's sandbox refuses ranges above MAX_RANGE items.
      if (numbers.size() >= 100000) fail(position, "range too big, maximum size is 100000");
      numbers.emplace_back(i);
    }
    return Value::list(std::move(numbers), Value::Sequence::Range);
  }
  if (name == "strftime_now") {
    // transformers: datetime.now().strftime(format), local time.
    const auto bound = bind(arguments, {"format"}, name, position);
    if (!bound[0]) fail(position, "strftime_now needs a format");
    const std::string& format = require_string(*bound[0], name, position);
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char text[256];
    const size_t size = std::strftime(text, sizeof text, format.c_str(), &local);
    if (size == 0 && !format.empty()) fail(position, "strftime_now: the date is too long");
    return Value(std::string(text, size));
  }
  refuse(position, "the function '" + name + "' is not supported");
}

Value call_method(const Value& object, const std::string& name, const Arguments& arguments,
                  Position position) {
  if (object.is_undefined()) {
    fail_undefined(object, position);
  }
  const std::string what = "str." + name;
  if (object.is_string()) {
    const std::string& text = object.as_string();
    if (name == "startswith" || name == "endswith") {
      const auto bound = bind(arguments, {"prefix"}, what, position);
      if (!bound[0]) fail(position, what + " needs an argument");
      return Value(starts_or_ends_with(text, *bound[0], name == "startswith", position));
    }
    if (name == "split" || name == "rsplit") {
      const auto bound = bind(arguments, {"sep", "maxsplit"}, what, position);
      return Value::list(split(text, bound[0], bound[1], name == "rsplit", position));
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const auto bound = bind(arguments, {"chars"}, what, position);
      return Value(strip(text, bound[0], name != "rstrip", name != "lstrip", position));
    }
    if (name == "replace") {
      const auto bound = bind(arguments, {"old", "new", "count"}, what, position);
      if (!bound[0] || !bound[1]) fail(position, what + " needs old and new");
      const int64_t count = bound[2] ? bound[2]->as_int() : -1;
      return Value(replace(text, require_string(*bound[0], what, position),
                           require_string(*bound[1], what, position), count, position));
    }
    if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
      bind(arguments, {}, what, position);
      return Value(ascii_case(text, name, position));
    }
    if (name == "find") {
      const auto bound = bind(arguments, {"sub"}, what, position);
      if (!bound[0]) fail(position, what + " needs an argument");
      const size_t found = text.find(require_string(*bound[0], what, position));
      if (found == std::string::npos) return Value(int64_t{-1});
      // Python counts code points.
      return Value(static_cast<int64_t>(decode_utf8(text.substr(0, found), position).size()));
    }
    if (name == "join") {
      const auto bound = bind(arguments, {"iterable"}, what, position);
      if (!bound[0]) fail(position, what + " needs an argument");
      std::string out;
      bool first = true;
      for (const Value& item : iterate(*bound[0], position)) {
        if (!first) out += text;
        first = false;
        out += require_string(item, what, position);
      }
      return Value(std::move(out));
    }
  }
  if (object.type() == Value::Type::Dict) {
    if (name == "items" || name == "keys" || name == "values") {
      bind(arguments, {}, "dict." + name, position);
      List items;
      for (const auto& [key, item] : object.as_dict()) {
        items.push_back(name == "items"  ? Value::list({key, item}, Value::Sequence::Tuple)
                        : name == "keys" ? Value(key)
                                         : item);
      }
      return Value::list(std::move(items), name == "items"  ? Value::Sequence::DictItems
                                           : name == "keys" ? Value::Sequence::DictKeys
                                                            : Value::Sequence::DictValues);
    }
    if (name == "get") {
      const auto bound = bind(arguments, {"key", "default"}, "dict.get", position);
      if (!bound[0]) fail(position, "dict.get needs a key");
      const Value* found = bound[0]->is_string() ? object.find(bound[0]->as_string()) : nullptr;
      if (found) return *found;
      return bound[1] ? *bound[1] : Value::none();
    }
  }
  if (is_python_method(object, name)) {
    refuse(position, "the method '" + name + "' of a " + type_name(object) + " is not supported");
  }
  fail(position, "'" + type_name(object) + "' object has no method '" + name + "'");
}

}  // namespace pipetrain::jinja
