#include "fingerprint/selection.h"

#include "common/json_pointer.h"
#include "idem/errors.h"

namespace idem::detail {

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
