// Key texts built from raw components without copying them first (KeyText::encode() takes its
// components as strings): for the facade, which keys every call.
#pragma once

#include <string>
#include <string_view>

#include "idem/key.h"

namespace idem::detail {

/// KeyText{form, user, intent, value}.encode(), from views: one string, each component escaped
/// by escape_key_component() and checked as it checks them (idem::InvalidKey).
[[nodiscard]] std::string encode_key(KeyForm form, std::string_view user, std::string_view intent,
                                     std::string_view value);

}  // namespace idem::detail
