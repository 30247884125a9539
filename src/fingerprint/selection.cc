#include "fingerprint/selection.h"

#include "idem/errors.h"

namespace idem::detail {

std::vector<std::string> parse_json_pointer(std::string_view pointer) {
  std::vector<std::string> tokens;
  if (pointer.empty()) return tokens;
  if (pointer.front() != '/') {
    throw ConfigError("idem: JSON Pointer \"" + std::string(pointer) +
                      "\" must be empty or start with '/'");
  }
  std::string token;
  for (std::size_t i = 1; i <= pointer.size(); ++i) {
    if (i == pointer.size() || pointer[i] == '/') {
      tokens.push_back(std::move(token));
      token.clear();
    } else if (pointer[i] == '~') {
      const char next = i + 1 < pointer.size() ? pointer[i + 1] : '\0';
      if (next != '0' && next != '1') {
        throw ConfigError("idem: JSON Pointer \"" + std::string(pointer) +
                          "\" has '~' not followed by 0 or 1");
      }
      token.push_back(next == '0' ? '~' : '/');
      ++i;
    } else {
      token.push_back(pointer[i]);
    }
  }
  return tokens;
}

const SelectionNode* SelectionNode::child(std::string_view name) const noexcept {
  for (const SelectionNode& node : children) {
    if (node.token == name) return &node;
  }
  return nullptr;
}

SelectionNode& Selection::node_for(const std::vector<std::string>& tokens) {
  SelectionNode* node = &root_;
  for (const std::string& token : tokens) {
    SelectionNode* next = nullptr;
    for (SelectionNode& candidate : node->children) {
      if (candidate.token == token) next = &candidate;
    }
    if (next == nullptr) {
      node->children.push_back(SelectionNode{token, false, -1, {}});
      next = &node->children.back();
    }
    node = next;
  }
  return *node;
}

Selection::Selection(const std::vector<std::string>& include,
                     const std::vector<std::string>& exclude) {
  for (const std::string& pointer : exclude) {
    const auto tokens = parse_json_pointer(pointer);
    if (tokens.empty())
      throw ConfigError("idem: excluding \"\" would leave nothing to fingerprint");
    node_for(tokens).excluded = true;
  }
  for (const std::string& pointer : include) {
    const auto tokens = parse_json_pointer(pointer);
    const SelectionNode* walk = &root_;
    for (const std::string& token : tokens) {
      walk = walk != nullptr ? walk->child(token) : nullptr;
      if (walk != nullptr && walk->excluded) {
        throw ConfigError("idem: include pointer \"" + pointer +
                          "\" lies inside an excluded member");
      }
    }
    SelectionNode& node = node_for(tokens);
    if (node.include_id < 0) {
      node.include_id = static_cast<int>(include_.size());
      include_.push_back(pointer);
    }
  }
}

}  // namespace idem::detail
