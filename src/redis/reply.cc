#include "redis/reply.h"

#include <hiredis/read.h>

#include <new>
#include <optional>
#include <utility>

namespace idem::detail {
namespace {

thread_local std::optional<long long> refused;  // the array refused last, for reader_failure()

// hiredis' own createArray, set once by bounded_functions().
void* (*hiredis_create_array)(const redisReadTask*, int) = nullptr;

void* create_bounded_array(const redisReadTask* task, int elements) {
  if (elements < 0 || elements > kMaxReplyElements) {
    refused = elements;
    return nullptr;  // the reader fails (REDIS_ERR_OOM) before allocating anything
  }
  return hiredis_create_array(task, elements);
}

// hiredis' own reply functions, but for arrays longer than kMaxReplyElements.
redisReplyObjectFunctions* bounded_functions() {
  static redisReplyObjectFunctions functions = [] {
    redisReader* plain = redisReaderCreate();
    if (plain == nullptr) throw std::bad_alloc();
    redisReplyObjectFunctions copy = *plain->fn;
    redisReaderFree(plain);
    hiredis_create_array = copy.createArray;
    copy.createArray = &create_bounded_array;
    return copy;
  }();
  return &functions;
}

}  // namespace

redisReader* bounded_reader() { return redisReaderCreateWithFunctions(bounded_functions()); }

void bound_reader(redisContext& context) { context.reader->fn = bounded_functions(); }

std::string reader_failure(const char* errstr) {
  if (const std::optional<long long> elements = std::exchange(refused, std::nullopt)) {
    return "a reply array of " + std::to_string(*elements) + " elements, more than the " +
           std::to_string(kMaxReplyElements) + " idem accepts";
  }
  return errstr;
}

}  // namespace idem::detail
