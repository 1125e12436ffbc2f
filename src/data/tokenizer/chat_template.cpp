#include "data/tokenizer/chat_template.h"

#include <stdexcept>

#include "data/tokenizer/chat_template_parser.h"
#include "data/tokenizer/chat_template_renderer.h"

namespace pipetrain {

ChatTemplate::ChatTemplate(std::shared_ptr<const std::vector<jinja::Stmt>> body)
    : body_(std::move(body)) {}

ChatTemplate ChatTemplate::parse(std::string_view source) {
  return ChatTemplate(
      std::make_shared<const std::vector<jinja::Stmt>>(jinja::parse(jinja::tokenize(source))));
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) {
    throw std::invalid_argument("a chat template's context must be a JSON object, not " +
                                std::string(context.type_name()));
  }
  return jinja::render(*body_, jinja::from_json(context));
}

std::string render_chat_template(std::string_view source, const nlohmann::ordered_json& context) {
  return ChatTemplate::parse(source).render(context);
}

}  // namespace pipetrain
