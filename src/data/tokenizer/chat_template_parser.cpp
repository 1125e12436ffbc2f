#include "data/tokenizer/chat_template_parser.h"

#include <algorithm>
#include <initializer_list>

#include "data/tokenizer/chat_template_builtins.h"

namespace pipetrain::jinja {

namespace {

// Statements of Jinja that chat templates could use and this renderer does not implement.
constexpr const char* kUnsupportedStatements[] = {
    "call", "filter",     "include", "import", "from",      "extends", "block",
    "with", "autoescape", "do",      "trans",  "pluralize", "raw"};

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {
    // The names the template defines macros of, wherever: what `name(...)` may call besides the
    // global functions.
    for (size_t i = 0; i + 2 < tokens.size(); ++i) {
      if (tokens[i].type == Token::Type::BlockBegin && tokens[i + 1].type == Token::Type::Name &&
          tokens[i + 1].value == "macro" && tokens[i + 2].type == Token::Type::Name) {
        macro_names_.push_back(tokens[i + 2].value);
      }
    }
  }

  Body parse_template() {
    Body body = parse_body({});
    if (current().type != Token::Type::End) {
      refuse(current().position, "unexpected '" + current().value + "'");
    }
    return body;
  }

 private:
  const Token& current() const { return tokens_[index_]; }
  const Token& peek(size_t ahead = 1) const {
    return tokens_[std::min(index_ + ahead, tokens_.size() - 1)];
  }
  const Token& advance() {
    const Token& token = tokens_[index_];
    if (token.type != Token::Type::End) ++index_;
    return token;
  }
  bool at_operator(const char* op) const {
    return current().type == Token::Type::Operator && current().value == op;
  }
  bool at_name(const char* name) const {
    return current().type == Token::Type::Name && current().value == name;
  }
  bool skip_operator(const char* op) {
    if (!at_operator(op)) return false;
    advance();
    return true;
  }
  bool skip_name(const char* name) {
    if (!at_name(name)) return false;
    advance();
    return true;
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    const Token& token = current();
    std::string found;
    switch (token.type) {
      case Token::Type::End:
        found = "the end of the template";
        break;
      case Token::Type::BlockEnd:
      case Token::Type::VariableEnd:
        found = "the end of the tag ('" + token.value + "')";
        break;
      case Token::Type::String:
        found = "a string";
        break;
      default:
        found = "'" + token.value + "'";
    }
    refuse(token.position, "expected " + expected + ", found " + found);
  }
  void expect_operator(const char* op) {
    if (!skip_operator(op)) unexpected(std::string("'") + op + "'");
  }
  std::string expect_name() {
    if (current().type != Token::Type::Name) unexpected("a name");
    return advance().value;
  }
  void expect_block_end() {
    if (current().type != Token::Type::BlockEnd) unexpected("'%}'");
    advance();
  }

  // Statements up to a `{% name %}` whose name is one of `ends` (left as the current token, after
  // its `{%`), or up to the template's end where `ends` is empty.
  Body parse_body(std::initializer_list<const char*> ends) {
    Body body;
    while (true) {
      const Token& token = current();
      if (token.type == Token::Type::End) {
        if (ends.size() == 0) return body;
        std::string names;
        for (const char* end : ends) names += std::string(names.empty() ? "" : " or ") + end;
        refuse(token.position, "the template ended where a block expected " + names);
      }
      if (token.type == Token::Type::Text) {
        Stmt text = statement(Stmt::Kind::Text, token.position);
        text.text = token.value;
        body.push_back(std::move(text));
        advance();
      } else if (token.type == Token::Type::VariableBegin) {
        Stmt output = statement(Stmt::Kind::Output, token.position);
        advance();
        output.expr = parse_tuple(true);
        if (current().type != Token::Type::VariableEnd) unexpected("'}}'");
        advance();
        body.push_back(std::move(output));
      } else if (token.type == Token::Type::BlockBegin) {
        const Token& name = peek();
        for (const char* end : ends) {
          if (name.type == Token::Type::Name && name.value == end) {
            advance();
            return body;
          }
        }
        advance();
        body.push_back(parse_statement());
      } else {
        unexpected("text or a tag");
      }
    }
  }

  Stmt parse_statement() {
    const Token& token = current();
    if (token.type != Token::Type::Name) unexpected("a statement");
    const std::string& name = token.value;
    if (name == "if") return parse_if();
    if (name == "for") return parse_for();
    if (name == "set") return parse_set();
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) refuse(token.position, "'" + name + "' outside a for loop");
      Stmt stmt =
          statement(name == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, token.position);
      advance();
      expect_block_end();
      return stmt;
    }
    if (name == "macro") return parse_macro();
    if (name == "generation") {
      Stmt stmt = statement(Stmt::Kind::Generation, token.position);
      advance();
      expect_block_end();
      stmt.body = parse_body({"endgeneration"});
      advance();
      expect_block_end();
      return stmt;
    }
    for (const char* unsupported : kUnsupportedStatements) {
      if (name == unsupported) {
        refuse(token.position, "the statement '" + name + "' is not supported");
      }
    }
    refuse(token.position, "unknown or unexpected statement '" + name + "'");
  }

  // {% macro name(a, b='default') %} body {% endmacro %}
  Stmt parse_macro() {
    Stmt stmt = statement(Stmt::Kind::Macro, current().position);
    advance();
    stmt.targets.push_back(expect_name());
    expect_operator("(");
    while (!at_operator(")")) {
      if (!stmt.parameters.empty()) expect_operator(",");
      if (at_operator(")")) break;
      std::string parameter = expect_name();
      ExprPtr default_value = skip_operator("=") ? parse_expression() : nullptr;
      stmt.parameters.emplace_back(std::move(parameter), std::move(default_value));
    }
    advance();
    expect_block_end();
    const int enclosing_loops = loop_depth_;
    loop_depth_ = 0;  // a loop around the definition is not the macro's
    stmt.body = parse_body({"endmacro"});
    loop_depth_ = enclosing_loops;
    advance();
    if (current().type == Token::Type::Name && current().value == stmt.targets[0]) advance();
    expect_block_end();
    return stmt;
  }

  Stmt parse_if() {
    Stmt stmt = statement(Stmt::Kind::If, current().position);
    advance();
    while (true) {
      ExprPtr condition = parse_tuple(false);
      expect_block_end();
      Body body = parse_body({"elif", "else", "endif"});
      stmt.branches.emplace_back(std::move(condition), std::move(body));
      const std::string end = advance().value;
      if (end == "elif") continue;
      if (end == "else") {
        expect_block_end();
        stmt.else_body = parse_body({"endif"});
        advance();
      }
      expect_block_end();
      return stmt;
    }
  }

  Stmt parse_for() {
    Stmt stmt = statement(Stmt::Kind::For, current().position);
    advance();
    stmt.targets = parse_target_names();
    if (!skip_name("in")) unexpected("'in'");
    stmt.expr = parse_tuple(false);
    if (skip_name("if")) stmt.condition = parse_expression();
    if (at_name("recursive")) refuse(current().position, "recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    stmt.body = parse_body({"else", "endfor"});
    --loop_depth_;
    if (advance().value == "else") {
      expect_block_end();
      stmt.else_body = parse_body({"endfor"});
      advance();
    }
    expect_block_end();
    return stmt;
  }

  // `name`, `a, b` or `(a, b)`: what a for loop or a set unpacks into.
  std::vector<std::string> parse_target_names() {
    std::vector<std::string> names;
    const bool parenthesized = skip_operator("(");
    do {
      names.push_back(expect_name());
    } while (skip_operator(",") && current().type == Token::Type::Name);
    if (parenthesized) expect_operator(")");
    return names;
  }

  Stmt parse_set() {
    Stmt stmt = statement(Stmt::Kind::Set, current().position);
    advance();
    if (current().type == Token::Type::Name && peek().type == Token::Type::Operator &&
        peek().value == ".") {
      stmt.targets.push_back(advance().value);  // a namespace's attribute
      advance();
      stmt.attribute = expect_name();
    } else {
      stmt.targets = parse_target_names();
    }
    if (skip_operator("=")) {
      stmt.expr = parse_tuple(true);
      expect_block_end();
      return stmt;
    }
    if (stmt.targets.size() != 1 || !stmt.attribute.empty()) unexpected("'='");
    if (at_operator("|")) refuse(current().position, "filters on a set block are not supported");
    expect_block_end();
    stmt.kind = Stmt::Kind::SetBlock;
    stmt.body = parse_body({"endset"});
    advance();
    expect_block_end();
    return stmt;
  }

  static Stmt statement(Stmt::Kind kind, Position position) {
    Stmt stmt;
    stmt.kind = kind;
    stmt.position = position;
    return stmt;
  }

  ExprPtr make(Expr::Kind kind, Position position) {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->position = position;
    return expr;
  }

  // An expression, or several separated by commas: a tuple (`{{ a, b }}`, `set x = 1, 2`).
  ExprPtr parse_tuple(bool with_conditional) {
    const Position position = current().position;
    ExprPtr first = parse_expression(with_conditional);
    if (!at_operator(",")) return first;
    ExprPtr tuple = make(Expr::Kind::Tuple, position);
    tuple->items.push_back(std::move(first));
    while (skip_operator(",")) {
      if (current().type == Token::Type::BlockEnd || current().type == Token::Type::VariableEnd) {
        break;
      }
      tuple->items.push_back(parse_expression(with_conditional));
    }
    return tuple;
  }

  ExprPtr parse_expression(bool with_conditional = true) {
    return with_conditional ? parse_conditional() : parse_or();
  }

  ExprPtr parse_conditional() {
    ExprPtr expr = parse_or();
    while (at_name("if")) {
      ExprPtr conditional = make(Expr::Kind::Conditional, current().position);
      advance();
      ExprPtr condition = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_conditional() : nullptr;
      conditional->items.push_back(std::move(expr));
      conditional->items.push_back(std::move(condition));
      conditional->items.push_back(std::move(otherwise));
      expr = std::move(conditional);
    }
    return expr;
  }

  // `or` binds looser than `and`, which binds looser than `not`; both left-associative.
  ExprPtr parse_or() { return parse_logical("or", Expr::Kind::Or, &Parser::parse_and); }
  ExprPtr parse_and() { return parse_logical("and", Expr::Kind::And, &Parser::parse_not); }

  ExprPtr parse_logical(const char* word, Expr::Kind kind, ExprPtr (Parser::*operand)()) {
    ExprPtr left = (this->*operand)();
    while (at_name(word)) {
      ExprPtr node = make(kind, advance().position);
      node->items.push_back(std::move(left));
      node->items.push_back((this->*operand)());
      left = std::move(node);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      ExprPtr node = make(Expr::Kind::Not, advance().position);
      node->object = parse_not();
      return node;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Position position = current().position;
    ExprPtr first = parse_arithmetic();
    ExprPtr compare;
    while (true) {
      std::string op;
      if (current().type == Token::Type::Operator &&
          (current().value == "==" || current().value == "!=" || current().value == "<" ||
           current().value == "<=" || current().value == ">" || current().value == ">=")) {
        op = advance().value;
      } else if (at_name("in")) {
        advance();
        op = "in";
      } else if (at_name("not") && peek().type == Token::Type::Name && peek().value == "in") {
        advance();
        advance();
        op = "not in";
      } else {
        break;
      }
      if (!compare) {
        compare = make(Expr::Kind::Compare, position);
        compare->items.push_back(std::move(first));
      }
      compare->operators.push_back(op);
      compare->items.push_back(parse_arithmetic());
    }
    return compare ? std::move(compare) : std::move(first);
  }

  // Jinja's arithmetic, loosest first: + -, then ~, then * / // %, then **; each level
  // left-associative.
  ExprPtr parse_arithmetic(size_t level = 0) {
    static const std::vector<std::vector<std::string>> kLevels = {
        {"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};
    if (level == kLevels.size()) return parse_unary(true);
    ExprPtr left = parse_arithmetic(level + 1);
    const auto& operators = kLevels[level];
    while (current().type == Token::Type::Operator &&
           std::find(operators.begin(), operators.end(), current().value) != operators.end()) {
      ExprPtr node = make(Expr::Kind::Binary, current().position);
      node->name = advance().value;
      node->items.push_back(std::move(left));
      node->items.push_back(parse_arithmetic(level + 1));
      left = std::move(node);
    }
    return left;
  }

  // Jinja binds a sign tighter than filters: `-x|abs` is `(-x)|abs`.
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (at_operator("-") || at_operator("+")) {
      node =
          make(at_operator("-") ? Expr::Kind::Negative : Expr::Kind::Positive, current().position);
      advance();
      node->object = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    return with_filter ? parse_filters_and_tests(std::move(node)) : std::move(node);
  }

  ExprPtr parse_primary() {
    const Token& token = current();
    ExprPtr node;
    switch (token.type) {
      case Token::Type::Name: {
        node = make(Expr::Kind::Literal, token.position);
        if (token.value == "true" || token.value == "True") {
          node->value = Value(true);
        } else if (token.value == "false" || token.value == "False") {
          node->value = Value(false);
        } else if (token.value == "none" || token.value == "None") {
          node->value = Value::none();
        } else {
          node->kind = Expr::Kind::Name;
          node->name = token.value;
        }
        advance();
        return node;
      }
      case Token::Type::String: {
        // Adjacent literals are one string, as in Python.
        std::string text;
        while (current().type == Token::Type::String) text += advance().value;
        node = make(Expr::Kind::Literal, token.position);
        node->value = Value(std::move(text));
        return node;
      }
      case Token::Type::Integer:
        node = make(Expr::Kind::Literal, token.position);
        node->value = Value(token.integer);
        advance();
        return node;
      case Token::Type::Float:
        node = make(Expr::Kind::Literal, token.position);
        node->value = Value(token.number);
        advance();
        return node;
      case Token::Type::Operator:
        if (token.value == "(") return parse_parenthesized();
        if (token.value == "[") return parse_collection(Expr::Kind::List, "]");
        if (token.value == "{") return parse_collection(Expr::Kind::Dict, "}");
        break;
      default:
        break;
    }
    unexpected("an expression");
  }

  // `(a)` is a, `()` and `(a,)` and `(a, b)` are tuples.
  ExprPtr parse_parenthesized() {
    const Position position = advance().position;
    ExprPtr tuple = make(Expr::Kind::Tuple, position);
    if (skip_operator(")")) return tuple;
    ExprPtr first = parse_expression();
    if (skip_operator(")")) return first;
    tuple->items.push_back(std::move(first));
    while (skip_operator(",")) {
      if (at_operator(")")) break;
      tuple->items.push_back(parse_expression());
    }
    expect_operator(")");
    return tuple;
  }

  // A list literal's items, or a dict literal's keys and values one after the other.
  ExprPtr parse_collection(Expr::Kind kind, const char* close) {
    ExprPtr collection = make(kind, advance().position);
    while (!at_operator(close)) {
      if (!collection->items.empty()) expect_operator(",");
      if (at_operator(close)) break;
      collection->items.push_back(parse_expression());
      if (kind == Expr::Kind::Dict) {
        expect_operator(":");
        collection->items.push_back(parse_expression());
      }
    }
    advance();
    return collection;
  }

  // `.name`, `.0`, `[index]`, `[start:stop:step]` and calls, left to right.
  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (at_operator(".")) {
        const Position position = advance().position;
        if (current().type == Token::Type::Integer) {
          ExprPtr item = make(Expr::Kind::Item, position);
          ExprPtr index = make(Expr::Kind::Literal, current().position);
          index->value = Value(advance().integer);
          item->object = std::move(node);
          item->items.push_back(std::move(index));
          node = std::move(item);
          continue;
        }
        ExprPtr attribute = make(Expr::Kind::Attribute, position);
        attribute->name = expect_name();
        attribute->object = std::move(node);
        node = std::move(attribute);
      } else if (at_operator("[")) {
        node = parse_subscript(std::move(node));
      } else if (at_operator("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {
    const Position position = advance().position;
    ExprPtr bounds[3];
    bool slice = false;
    for (int part = 0; part < 3; ++part) {
      if (!at_operator(":") && !at_operator("]")) bounds[part] = parse_expression();
      if (part < 2 && skip_operator(":")) {
        slice = true;
        continue;
      }
      break;
    }
    if (at_operator(",")) refuse(current().position, "tuple subscripts are not supported");
    expect_operator("]");
    ExprPtr node = make(slice ? Expr::Kind::Slice : Expr::Kind::Item, position);
    node->object = std::move(object);
    if (!slice && !bounds[0]) refuse(position, "an empty subscript '[]'");
    node->items.push_back(std::move(bounds[0]));
    if (slice) {
      node->items.push_back(std::move(bounds[1]));
      node->items.push_back(std::move(bounds[2]));
    }
    return node;
  }

  // `(a, b, key=c)`, into `node`'s items and keywords.
  void parse_arguments(Expr& node) {
    expect_operator("(");
    while (!at_operator(")")) {
      if (!node.items.empty() || !node.keywords.empty()) expect_operator(",");
      if (at_operator(")")) break;
      if (at_operator("*") || at_operator("**")) {
        refuse(current().position, "'*' and '**' arguments are not supported");
      }
      if (current().type == Token::Type::Name && peek().type == Token::Type::Operator &&
          peek().value == "=") {
        std::string keyword = advance().value;
        advance();
        node.keywords.emplace_back(std::move(keyword), parse_expression());
      } else {
        if (!node.keywords.empty()) unexpected("a keyword argument after keyword arguments");
        node.items.push_back(parse_expression());
      }
    }
    advance();
  }

  ExprPtr parse_call(ExprPtr callee) {
    ExprPtr call = make(Expr::Kind::Call, current().position);
    if (callee->kind == Expr::Kind::Name) {
      const bool macro =
          std::find(macro_names_.begin(), macro_names_.end(), callee->name) != macro_names_.end();
      if (!macro && !is_global_function(callee->name)) {
        refuse(callee->position, "the function '" + callee->name + "' is not supported");
      }
    } else if (callee->kind == Expr::Kind::Attribute) {
      if (!is_method(callee->name)) {
        refuse(callee->position, "the method '" + callee->name + "' is not supported");
      }
    } else {
      refuse(call->position, "calling this kind of expression is not supported");
    }
    call->object = std::move(callee);
    parse_arguments(*call);
    return call;
  }

  ExprPtr parse_filters_and_tests(ExprPtr node) {
    while (true) {
      if (at_operator("|")) {
        advance();
        ExprPtr filter = parse_named(Expr::Kind::Filter, "filter", is_filter);
        if (at_operator("(")) parse_arguments(*filter);
        filter->object = std::move(node);
        node = std::move(filter);
      } else if (at_name("is")) {
        node = parse_test(std::move(node));
      } else if (at_operator("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  // A filter's or test's name, refused unless `known` knows it.
  ExprPtr parse_named(Expr::Kind kind, const std::string& what, bool (*known)(std::string_view)) {
    ExprPtr node = make(kind, current().position);
    node->name = expect_name();
    if (at_operator(".")) refuse(current().position, "dotted " + what + " names are not supported");
    if (!known(node->name)) {
      refuse(node->position, "the " + what + " '" + node->name + "' is not supported");
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    advance();  // is
    const bool negated = skip_name("not");
    ExprPtr test = parse_named(Expr::Kind::Test, "test", is_test);
    const Token& next = current();
    if (at_operator("(")) {
      parse_arguments(*test);
    } else if ((next.type == Token::Type::Name || next.type == Token::Type::String ||
                next.type == Token::Type::Integer || next.type == Token::Type::Float ||
                at_operator("[") || at_operator("{")) &&
               !at_name("else") && !at_name("or") && !at_name("and")) {
      // Jinja takes one argument without parentheses: `x is divisibleby 3`.
      if (at_name("is")) refuse(next.position, "tests cannot be chained with 'is'");
      test->items.push_back(parse_postfix(parse_primary()));
    }
    test->object = std::move(node);
    if (!negated) return test;
    ExprPtr negation = make(Expr::Kind::Not, test->position);
    negation->object = std::move(test);
    return negation;
  }

  const std::vector<Token>& tokens_;
  std::vector<std::string> macro_names_;
  size_t index_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace pipetrain::jinja
