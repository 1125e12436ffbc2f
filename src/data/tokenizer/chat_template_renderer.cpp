#include "data/tokenizer/chat_template_renderer.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <unordered_map>

#include "data/tokenizer/chat_template_builtins.h"

namespace pipetrain::jinja {

// A macro as a value: its definition, and how many scopes were open where it was defined, which
// are what its body sees besides its parameters (Jinja's macros see the variables around their
// definition as they are when called, not the caller's).
struct Macro {
  const Stmt* definition;
  size_t depth;
};

namespace {

// Jinja's macros can recurse; Python stops a runaway recursion, and so does this.
constexpr int kMaxMacroDepth = 100;

// Python's ints are unbounded; these are 64 bits, and a result beyond them is refused.
void check_overflow(bool overflowed, Position position) {
  if (overflowed) refuse(position, "integers beyond 64 bits are not supported");
}

// CPython's float floor division and modulo (float_divmod).
std::pair<double, double> python_float_divmod(double x, double y) {
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  double floor_div;
  if (div != 0) {
    floor_div = std::floor(div);
    if (div - floor_div > 0.5) floor_div += 1.0;
  } else {
    floor_div = std::copysign(0.0, x / y);
  }
  return {floor_div, mod};
}

Value repeat(const Value& sequence, int64_t times) {
  if (sequence.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += sequence.as_string();
    return Value(std::move(out));
  }
  List out;
  for (int64_t i = 0; i < times; ++i) {
    out.insert(out.end(), sequence.as_list().begin(), sequence.as_list().end());
  }
  return Value::list(std::move(out), sequence.sequence());
}

Value arithmetic(const std::string& op, const Value& a, const Value& b, Position position) {
  if (a.is_undefined()) fail_undefined(a, position);
  if (b.is_undefined()) fail_undefined(b, position);
  if (a.is_number() && b.is_number()) {
    const bool integers = a.is_integral() && b.is_integral();
    if (integers) {
      const int64_t x = a.as_int();
      const int64_t y = b.as_int();
      int64_t r = 0;
      if (op == "+") {
        check_overflow(__builtin_add_overflow(x, y, &r), position);
        return Value(r);
      }
      if (op == "-") {
        check_overflow(__builtin_sub_overflow(x, y, &r), position);
        return Value(r);
      }
      if (op == "*") {
        check_overflow(__builtin_mul_overflow(x, y, &r), position);
        return Value(r);
      }
      if (op == "//" || op == "%") {
        if (y == 0) fail(position, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1)
          refuse(position, "integers beyond 64 bits are not supported");
        int64_t quotient = x / y;
        int64_t remainder = x % y;
        if (remainder != 0 && ((remainder < 0) != (y < 0))) {
          --quotient;
          remainder += y;
        }
        return Value(op == "//" ? quotient : remainder);
      }
      if (op == "**" && y >= 0) {
        int64_t power = 1;
        for (int64_t i = 0; i < y; ++i) {
          check_overflow(__builtin_mul_overflow(power, x, &power), position);
        }
        return Value(power);
      }
    }
    const double x = a.as_float();
    const double y = b.as_float();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "/") {
      if (y == 0) fail(position, "division by zero");
      return Value(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) fail(position, "float floor division or modulo by zero");
      const auto [quotient, remainder] = python_float_divmod(x, y);
      return Value(op == "//" ? quotient : remainder);
    }
    if (op == "**") {
      if (x == 0 && y < 0) fail(position, "0.0 cannot be raised to a negative power");
      if (x < 0 && y != std::floor(y)) refuse(position, "complex powers are not supported");
      return Value(std::pow(x, y));
    }
  }
  // Lists and tuples add and repeat (a list to a list, a tuple to a tuple), as strings do.
  auto concatenable = [](const Value& v) {
    return v.is_string() ||
           (v.type() == Value::Type::List &&
            (v.sequence() == Value::Sequence::List || v.sequence() == Value::Sequence::Tuple));
  };
  const bool sequence_a = concatenable(a);
  const bool sequence_b = concatenable(b);
  if (op == "+" && sequence_a && sequence_b && a.type() == b.type() &&
      a.sequence() == b.sequence()) {
    if (a.is_string()) return Value(a.as_string() + b.as_string());
    List items = a.as_list();
    items.insert(items.end(), b.as_list().begin(), b.as_list().end());
    return Value::list(std::move(items), a.sequence());
  }
  if (op == "*" && sequence_a && b.is_integral()) return repeat(a, b.as_int());
  if (op == "*" && sequence_b && a.is_integral()) return repeat(b, a.as_int());
  if (op == "%" && a.is_string()) {
    refuse(position, "printf-style string formatting ('%') is not supported");
  }
  fail(position, "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
                     type_name(b) + "'");
}

bool contains(const Value& container, const Value& item, Position position) {
  switch (container.type()) {
    case Value::Type::Undefined:
      return false;  // Jinja's undefined iterates as empty
    case Value::Type::String:
      if (!item.is_string()) {
        fail(position, "'in <string>' requires string as left operand, not " + type_name(item));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Type::List:
      for (const Value& element : container.as_list()) {
        if (equals(element, item)) return true;
      }
      return false;
    case Value::Type::Dict:
      if (item.type() == Value::Type::List || item.type() == Value::Type::Dict ||
          item.type() == Value::Type::Namespace) {
        fail(position, "unhashable type: '" + type_name(item) + "'");
      }
      return item.is_string() && container.find(item.as_string()) != nullptr;
    default:
      fail(position, "argument of type '" + type_name(container) + "' is not iterable");
  }
}

bool compare(const std::string& op, const Value& a, const Value& b, Position position) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return contains(b, a, position);
  if (op == "not in") return !contains(b, a, position);
  if (a.is_undefined()) fail_undefined(a, position);
  if (b.is_undefined()) fail_undefined(b, position);
  if (op == "<") return less(a, b, position);
  if (op == ">") return less(b, a, position);
  if (op == "<=") return !less(b, a, position);
  return !less(a, b, position);  // >=
}

// Python's sequence[start:stop:step] (PySlice_AdjustIndices).
Value slice(const Value& object, const Value* bounds[3], Position position) {
  if (object.is_undefined()) fail_undefined(object, position);
  // Jinja slices with Python's own subscript, not its getitem: no undefined for other types.
  if (object.type() == Value::Type::Dict) fail(position, "unhashable type: 'slice'");
  if (!object.is_indexable_sequence() && !object.is_string()) {
    fail(position, "'" + type_name(object) + "' object is not subscriptable");
  }
  for (int i = 0; i < 3; ++i) {
    if (bounds[i] && !bounds[i]->is_none() && !bounds[i]->is_integral()) {
      fail(position, "slice indices must be integers or None");
    }
  }
  auto given = [&](int i) { return bounds[i] && !bounds[i]->is_none(); };
  const int64_t step = given(2) ? bounds[2]->as_int() : 1;
  if (step == 0) fail(position, "slice step cannot be zero");
  std::u32string code_points;
  if (object.is_string()) code_points = decode_utf8(object.as_string(), position);
  const int64_t length = object.is_string() ? static_cast<int64_t>(code_points.size())
                                            : static_cast<int64_t>(object.as_list().size());
  auto adjust = [&](int i, int64_t otherwise) {
    if (!given(i)) return otherwise;
    int64_t index = bounds[i]->as_int();
    if (index < 0) {
      index += length;
      if (index < 0) index = step < 0 ? -1 : 0;
    } else if (index >= length) {
      index = step < 0 ? length - 1 : length;
    }
    return index;
  };
  const int64_t start = adjust(0, step < 0 ? length - 1 : 0);
  const int64_t stop = adjust(1, step < 0 ? -1 : length);
  if (object.is_string()) {
    std::u32string out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out += code_points[i];
    return Value(encode_utf8(out));
  }
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    out.push_back(object.as_list()[i]);
  }
  return Value::list(std::move(out), object.sequence());
}

class Renderer {
 public:
  explicit Renderer(const Value& variables) {
    scopes_.emplace_back();
    for (const auto& [name, value] : variables.as_dict()) scopes_.back()[name] = value;
  }

  enum class Flow { Normal, Break, Continue };

  Flow run(const Body& body, std::string& out) {
    for (const Stmt& stmt : body) {
      const Flow flow = run(stmt, out);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

 private:
  Flow run(const Stmt& stmt, std::string& out) {
    switch (stmt.kind) {
      case Stmt::Kind::Text:
        out += stmt.text;
        return Flow::Normal;
      case Stmt::Kind::Output:
        out += to_str(evaluate(*stmt.expr), stmt.expr->position);
        return Flow::Normal;
      case Stmt::Kind::If:
        for (const auto& [condition, body] : stmt.branches) {
          if (truthy(evaluate(*condition))) return run(body, out);
        }
        return run(stmt.else_body, out);
      case Stmt::Kind::For:
        return run_for(stmt, out);
      case Stmt::Kind::Set:
        assign(stmt, evaluate(*stmt.expr));
        return Flow::Normal;
      case Stmt::Kind::SetBlock: {
        // The block's own assignments stay inside it, as in Jinja; a break or continue inside
        // it leaves the enclosing loop's iteration at once, the variable unset.
        std::string captured;
        scopes_.emplace_back();
        const Flow flow = run(stmt.body, captured);
        scopes_.pop_back();
        if (flow == Flow::Normal) assign(stmt, Value(std::move(captured)));
        return flow;
      }
      case Stmt::Kind::Break:
        return Flow::Break;
      case Stmt::Kind::Continue:
        return Flow::Continue;
      case Stmt::Kind::Generation:
        return run(stmt.body, out);
      case Stmt::Kind::Macro:
        scopes_.back()[stmt.targets[0]] =
            Value::macro(std::make_shared<const Macro>(Macro{&stmt, scopes_.size()}));
        return Flow::Normal;
    }
    return Flow::Normal;
  }

  void bind_targets(const std::vector<std::string>& targets, const Value& value,
                    Position position) {
    auto& scope = scopes_.back();
    if (targets.size() == 1) {
      scope[targets[0]] = value;
      return;
    }
    if (value.type() != Value::Type::List || value.as_list().size() != targets.size()) {
      fail(position, "cannot unpack a " + type_name(value) + " into " +
                         std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < targets.size(); ++i) scope[targets[i]] = value.as_list()[i];
  }

  void assign(const Stmt& stmt, const Value& value) {
    if (stmt.attribute.empty()) {
      bind_targets(stmt.targets, value, stmt.position);
      return;
    }
    const Value target = lookup(stmt.targets[0], stmt.position);
    if (target.type() != Value::Type::Namespace) {
      fail(stmt.position, "cannot assign an attribute of a non-namespace object");
    }
    for (auto& [name, attribute] : target.namespace_attributes()) {
      if (name == stmt.attribute) {
        attribute = value;
        return;
      }
    }
    target.namespace_attributes().emplace_back(stmt.attribute, value);
  }

  // Jinja's for: the `if` filter first, then `loop` counts the items that passed; each
  // iteration's variables are its own. Returns the else block's break or continue, which is the
  // enclosing loop's.
  Flow run_for(const Stmt& stmt, std::string& out) {
    const Value iterable = evaluate(*stmt.expr);
    List items;
    switch (iterable.type()) {
      case Value::Type::Undefined:
        break;
      case Value::Type::List:
        items = iterable.as_list();
        break;
      case Value::Type::Dict:
        for (const auto& item : iterable.as_dict()) items.emplace_back(item.first);
        break;
      case Value::Type::String:
        for (char32_t c : decode_utf8(iterable.as_string(), stmt.expr->position)) {
          items.emplace_back(encode_utf8(std::u32string(1, c)));
        }
        break;
      default:
        fail(stmt.expr->position, "'" + type_name(iterable) + "' object is not iterable");
    }
    if (stmt.condition) {
      List kept;
      for (const Value& item : items) {
        scopes_.emplace_back();
        bind_targets(stmt.targets, item, stmt.position);
        const bool keep = truthy(evaluate(*stmt.condition));
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    // Jinja runs the else block unless an iteration ran its body to the end: a loop left by
    // `break`, or whose every iteration ended in `continue`, runs it too.
    bool completed_an_iteration = false;
    const auto count = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < count; ++i) {
      scopes_.emplace_back();
      bind_targets(stmt.targets, items[i], stmt.position);
      Dict loop = {{"index0", Value(i)},
                   {"index", Value(i + 1)},
                   {"revindex0", Value(count - i - 1)},
                   {"revindex", Value(count - i)},
                   {"first", Value(i == 0)},
                   {"last", Value(i == count - 1)},
                   {"length", Value(count)},
                   {"depth0", Value(int64_t{0})},
                   {"depth", Value(int64_t{1})}};
      if (i > 0) loop.emplace_back("previtem", items[i - 1]);
      if (i + 1 < count) loop.emplace_back("nextitem", items[i + 1]);
      scopes_.back()["loop"] = Value::dict(std::move(loop));
      const Flow flow = run(stmt.body, out);
      scopes_.pop_back();
      if (flow == Flow::Normal) completed_an_iteration = true;
      if (flow == Flow::Break) break;
    }
    if (completed_an_iteration) return Flow::Normal;
    // Its assignments stay inside it; it sees neither the loop variables nor `loop`.
    scopes_.emplace_back();
    const Flow flow = run(stmt.else_body, out);
    scopes_.pop_back();
    return flow;
  }

  bool is_bound(const std::string& name) const {
    for (const auto& scope : scopes_) {
      if (scope.count(name)) return true;
    }
    return false;
  }

  Value lookup(const std::string& name, Position position) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      const auto found = scope->find(name);
      if (found != scope->end()) return found->second;
    }
    if (is_global_function(name)) {
      refuse(position, "the function '" + name + "' used other than by calling it");
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  // A macro's output for `arguments`, bound to its parameters as Jinja binds them.
  Value call_macro(const Macro& macro, const Arguments& arguments, Position position) {
    const Stmt& definition = *macro.definition;
    const std::string& name = definition.targets[0];
    if (macro.depth > scopes_.size()) fail(position, "macro '" + name + "' called out of scope");
    if (macro_depth_ >= kMaxMacroDepth) fail(position, "macro recursion too deep");
    const Keywords& parameters = definition.parameters;
    if (arguments.positional.size() > parameters.size()) {
      fail(position, "macro '" + name + "' takes not more than " +
                         std::to_string(parameters.size()) + " argument(s)");
    }
    // The caller's own scopes are out of the macro's sight while it runs.
    std::vector<std::unordered_map<std::string, Value>> callers(
        std::make_move_iterator(scopes_.begin() + macro.depth),
        std::make_move_iterator(scopes_.end()));
    scopes_.resize(macro.depth);
    scopes_.emplace_back();
    auto& scope = scopes_.back();
    for (size_t i = 0; i < arguments.positional.size(); ++i) {
      scope[parameters[i].first] = arguments.positional[i];
    }
    for (const auto& [keyword, value] : arguments.keywords) {
      // A copy: lambdas may not capture structured bindings before C++20 (clang refuses).
      const std::string& name_given = keyword;
      const auto parameter = std::find_if(parameters.begin(), parameters.end(),
                                          [&](const auto& p) { return p.first == name_given; });
      if (parameter == parameters.end()) {
        fail(position, "macro '" + name + "' takes no keyword argument '" + keyword + "'");
      }
      if (static_cast<size_t>(parameter - parameters.begin()) < arguments.positional.size()) {
        fail(position, "macro '" + name + "' got multiple values for argument '" + keyword + "'");
      }
      scope[keyword] = value;
    }
    // Defaults are evaluated in the macro's scope, which a default calling a macro may move:
    // scopes_.back(), not `scope`, from here on.
    for (const auto& [parameter, default_value] : parameters) {
      if (scopes_.back().count(parameter)) continue;
      Value value = default_value
                        ? evaluate(*default_value)
                        : Value::undefined("parameter '" + parameter + "' was not provided");
      scopes_.back()[parameter] = std::move(value);
    }
    scopes_.back()["varargs"] = Value::list({}, Value::Sequence::Tuple);
    scopes_.back()["kwargs"] = Value::dict({});
    std::string out;
    ++macro_depth_;
    run(definition.body, out);
    --macro_depth_;
    scopes_.pop_back();
    for (auto& caller : callers) scopes_.push_back(std::move(caller));
    return Value(std::move(out));
  }

  Arguments evaluate_arguments(const Expr& expr) {
    Arguments arguments;
    for (const ExprPtr& item : expr.items) arguments.positional.push_back(evaluate(*item));
    for (const auto& [name, value] : expr.keywords) {
      arguments.keywords.emplace_back(name, evaluate(*value));
    }
    return arguments;
  }

  Value evaluate(const Expr& expr) {
    switch (expr.kind) {
      case Expr::Kind::Literal:
        return expr.value;
      case Expr::Kind::Name:
        return lookup(expr.name, expr.position);
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        List items;
        for (const ExprPtr& item : expr.items) items.push_back(evaluate(*item));
        return Value::list(std::move(items), expr.kind == Expr::Kind::Tuple
                                                 ? Value::Sequence::Tuple
                                                 : Value::Sequence::List);
      }
      case Expr::Kind::Dict: {
        Dict items;
        for (size_t i = 0; i + 1 < expr.items.size(); i += 2) {
          const Value key = evaluate(*expr.items[i]);
          if (!key.is_string()) refuse(expr.items[i]->position, "dict keys other than strings");
          Value value = evaluate(*expr.items[i + 1]);
          bool replaced = false;
          for (auto& [existing, item] : items) {
            if (existing == key.as_string()) {
              item = value;
              replaced = true;
            }
          }
          if (!replaced) items.emplace_back(key.as_string(), std::move(value));
        }
        return Value::dict(std::move(items));
      }
      case Expr::Kind::Attribute:
        return get_attribute(evaluate(*expr.object), expr.name, expr.position);
      case Expr::Kind::Item:
        return get_item(evaluate(*expr.object), evaluate(*expr.items[0]), expr.position);
      case Expr::Kind::Slice: {
        const Value object = evaluate(*expr.object);
        Value values[3];
        const Value* bounds[3] = {nullptr, nullptr, nullptr};
        for (int i = 0; i < 3; ++i) {
          if (expr.items[i]) {
            values[i] = evaluate(*expr.items[i]);
            bounds[i] = &values[i];
          }
        }
        return slice(object, bounds, expr.position);
      }
      case Expr::Kind::Call: {
        const Expr& callee = *expr.object;
        if (callee.kind == Expr::Kind::Name) {
          if (is_bound(callee.name)) {
            const Value function = lookup(callee.name, callee.position);
            if (function.type() != Value::Type::Macro) {
              fail(callee.position, "'" + type_name(function) + "' object is not callable");
            }
            return call_macro(function.as_macro(), evaluate_arguments(expr), callee.position);
          }
          if (!is_global_function(callee.name)) {
            fail(callee.position, "'" + callee.name + "' is undefined");
          }
          return call_global_function(callee.name, evaluate_arguments(expr), callee.position);
        }
        const Value object = evaluate(*callee.object);
        return call_method(object, callee.name, evaluate_arguments(expr), callee.position);
      }
      case Expr::Kind::Filter: {
        const Value value = evaluate(*expr.object);
        return apply_filter(expr.name, value, evaluate_arguments(expr), expr.position);
      }
      case Expr::Kind::Test: {
        // transformers' global functions are defined: `strftime_now is defined` is true.
        if ((expr.name == "defined" || expr.name == "undefined") &&
            expr.object->kind == Expr::Kind::Name && !is_bound(expr.object->name) &&
            is_global_function(expr.object->name)) {
          return Value(expr.name == "defined");
        }
        const Value value = evaluate(*expr.object);
        return Value(apply_test(expr.name, value, evaluate_arguments(expr), expr.position));
      }
      case Expr::Kind::Not:
        return Value(!truthy(evaluate(*expr.object)));
      case Expr::Kind::Negative:
      case Expr::Kind::Positive: {
        const Value value = evaluate(*expr.object);
        if (value.is_undefined()) fail_undefined(value, expr.position);
        if (!value.is_number()) {
          fail(expr.position, "bad operand type for unary " +
                                  std::string(expr.kind == Expr::Kind::Negative ? "-" : "+") +
                                  ": '" + type_name(value) + "'");
        }
        if (expr.kind == Expr::Kind::Positive) {
          return value.is_integral() ? Value(value.as_int()) : value;
        }
        if (value.is_integral()) {
          int64_t negated = 0;
          check_overflow(__builtin_sub_overflow(int64_t{0}, value.as_int(), &negated),
                         expr.position);
          return Value(negated);
        }
        return Value(-value.as_float());
      }
      case Expr::Kind::Binary: {
        const Value a = evaluate(*expr.items[0]);
        const Value b = evaluate(*expr.items[1]);
        if (expr.name == "~") {
          return Value(to_str(a, expr.items[0]->position) + to_str(b, expr.items[1]->position));
        }
        return arithmetic(expr.name, a, b, expr.position);
      }
      case Expr::Kind::And: {
        Value left = evaluate(*expr.items[0]);
        return truthy(left) ? evaluate(*expr.items[1]) : left;
      }
      case Expr::Kind::Or: {
        Value left = evaluate(*expr.items[0]);
        return truthy(left) ? left : evaluate(*expr.items[1]);
      }
      case Expr::Kind::Compare: {
        Value left = evaluate(*expr.items[0]);
        for (size_t i = 0; i < expr.operators.size(); ++i) {
          Value right = evaluate(*expr.items[i + 1]);
          if (!compare(expr.operators[i], left, right, expr.position)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::Conditional:
        if (truthy(evaluate(*expr.items[1]))) return evaluate(*expr.items[0]);
        if (expr.items[2]) return evaluate(*expr.items[2]);
        return Value::undefined("the conditional expression had no else");
    }
    return Value();
  }

  std::vector<std::unordered_map<std::string, Value>> scopes_;
  int macro_depth_ = 0;
};

}  // namespace

std::string render(const Body& body, const Value& variables) {
  std::string out;
  Renderer(variables).run(body, out);
  return out;
}

}  // namespace pipetrain::jinja
