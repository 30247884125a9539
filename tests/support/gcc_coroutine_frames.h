// Included by the test files whose Asio coroutines GCC 12 warns about falsely: it inlines Asio's
// coroutine frame allocation down to ::operator new, sees the frame freed by the frame class's
// operator delete and calls the pair mismatched (-Wmismatched-new-delete), which IDEM_WERROR turns
// into a failed build; the class operator delete is the one that matches the class operator new
// Asio declares for its frames (as in src/redis/async_sentinel.cc). The pragma holds for the rest
// of the including file.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
