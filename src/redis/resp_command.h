// A Redis command as the bytes of the RESP protocol.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

namespace idem::detail {

/// One Redis command as RESP bytes (an array of bulk strings, as redisFormatCommandArgv writes
/// it). Binary-safe. Move-only; its bytes stay where they are when it is moved (one heap block),
/// so a view of them outlives a move of the command.
class RespCommand {
 public:
  /// Throws std::bad_alloc only.
  explicit RespCommand(std::span<const std::string_view> args);
  [[nodiscard]] std::string_view bytes() const noexcept { return {data_.get(), size_}; }

 private:
  std::unique_ptr<char[]> data_;
  std::size_t size_ = 0;
};

}  // namespace idem::detail
