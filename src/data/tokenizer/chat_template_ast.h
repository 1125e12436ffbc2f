// A parsed chat template: statements holding expressions. Plain data, built by the parser and
// walked by the renderer.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/tokenizer/chat_template_value.h"

namespace pipetrain::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
using Keywords = std::vector<std::pair<std::string, ExprPtr>>;

struct Expr {
  enum class Kind {
    Literal,      // value
    Name,         // name
    List,         // items
    Tuple,        // items
    Dict,         // items: key, value, key, value, ...
    Attribute,    // object.name
    Item,         // object[items[0]]
    Slice,        // object[items[0]:items[1]:items[2]], absent bounds null
    Call,         // object(items..., keywords...): a global function or a method
    Filter,       // object | name(items..., keywords...)
    Test,         // object is name(items...)
    Not,          // not object
    Negative,     // -object
    Positive,     // +object
    Binary,       // items[0] name items[1], name one of + - * / // % ** ~
    And,          // items[0] and items[1]
    Or,           // items[0] or items[1]
    Compare,      // items[0] operators[0] items[1] operators[1] items[2] ... (chained, as Python)
    Conditional,  // items[0] if items[1] else items[2] (null without else)
  };
  Kind kind;
  Position position;
  Value value;
  std::string name;
  ExprPtr object;
  std::vector<ExprPtr> items;
  Keywords keywords;
  std::vector<std::string> operators;
};

struct Stmt;
using Body = std::vector<Stmt>;

struct Stmt {
  enum class Kind {
    Text,        // text
    Output,      // {{ expr }}
    If,          // branches (if and elifs), else_body
    For,         // {% for targets in expr if condition %} body {% else %} else_body
    Set,         // {% set targets = expr %} or {% set targets[0].attribute = expr %}
    SetBlock,    // {% set targets[0] %} body {% endset %}
    Break,       // {% break %}
    Continue,    // {% continue %}
    Generation,  // {% generation %} body {% endgeneration %}: transformers' marker, renders body
    Macro,       // {% macro targets[0](parameters) %} body {% endmacro %}
  };
  Kind kind;
  Position position;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::string> targets;
  std::string attribute;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Keywords parameters;  // a macro's, in order, each with its default or null
  Body body;
  Body else_body;
};

}  // namespace pipetrain::jinja
