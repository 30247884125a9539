// Message digests through OpenSSL EVP, kept out of the public headers.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "idem/fingerprint.h"

namespace idem::detail {

/// An incremental digest whose OpenSSL context is reused across messages. Not thread-safe:
/// keep one per thread.
class Digest {
 public:
  Digest();
  ~Digest();
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;

  /// Starts a new message.
  void begin(HashAlgorithm algorithm);
  /// Adds bytes to the message.
  void update(std::string_view bytes);
  /// Ends the message and returns the first `hex_length` lowercase hex digits of its digest.
  [[nodiscard]] std::string finish_hex(std::size_t hex_length);

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

}  // namespace idem::detail
