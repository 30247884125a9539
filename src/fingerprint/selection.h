// Field selection by RFC 6901 JSON Pointers: a tree of the include and exclude pointers that
// the canonical writer walks beside the document.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace idem::detail {

/// One reference token position shared by one or more pointers.
struct SelectionNode {
  std::string token;
  bool excluded = false;  ///< an exclude pointer ends here: the value is left out
  int include_id = -1;    ///< an include pointer ends here (its index), else -1
  std::vector<SelectionNode> children;

  /// The child for `token`, or nullptr.
  [[nodiscard]] const SelectionNode* child(std::string_view name) const noexcept;
};

/// The include and exclude pointers of a Fingerprinter, immutable once built (thread-safe).
class Selection {
 public:
  /// Throws idem::ConfigError on a malformed pointer, on excluding the whole document, or on
  /// an include pointer at or below an exclude pointer.
  Selection(const std::vector<std::string>& include, const std::vector<std::string>& exclude);

  [[nodiscard]] const SelectionNode& root() const noexcept { return root_; }
  /// True when only included members are selected (the include list is not empty).
  [[nodiscard]] bool has_includes() const noexcept { return !include_.empty(); }
  /// Number of distinct include pointers; include_id runs over 0..include_count()-1.
  [[nodiscard]] std::size_t include_count() const noexcept { return include_.size(); }
  /// The include pointer with this id, as written in the options.
  [[nodiscard]] const std::string& include_pointer(int id) const {
    return include_[static_cast<std::size_t>(id)];
  }

 private:
  SelectionNode& node_for(const std::vector<std::string>& tokens);

  SelectionNode root_;
  std::vector<std::string> include_;
};

}  // namespace idem::detail
