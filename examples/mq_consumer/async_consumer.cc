// idem-mq-consumer consume --async: the consumer of main.cc with many entries in flight on ONE
// thread. One io_context runs everything: the stream commands, and up to --in-flight entries at
// once, each through idem::AsyncDeduplicator::run_transactional (the ledger row, `co_await
// tx.exec(...)`, and the user's total, `tx.stage(...)`, in the call's own transaction). The
// outcomes and the XACK rule are main.cc's (mq::settle): an entry is XACKed only after its
// commit.
//
// The stream commands must not block the loop either. idem's own async Redis client is internal
// (src/redis/, not installed), so this file speaks RESP itself over an Asio TCP socket, with
// hiredis' public protocol functions (redisFormatCommandArgv to build a command, a redisReader to
// parse replies). That was chosen over a reader thread running the blocking client of main.cc:
// a second thread would need a hand-off queue both ways (entries to the loop, XACKs back) and a
// lock on the counters, while a socket on the loop is one more coroutine. The stream needs one
// connection used by one coroutine (`pump`), which never BLOCKs while entries are in flight:
// it sends the XACKs gathered since its last round trip together with the next XREADGROUP (or
// XAUTOCLAIM) in one write, and while nothing new comes it waits for a call to finish.
#include <array>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <chrono>
#include <exception>
#include <iostream>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "idem/async_deduplicator.h"
#include "idem/errors.h"
#include "mq_consumer/stream.h"

// GCC 12 at -O1 (the sanitized builds' level) inlines Asio's coroutine frame allocation down to
// ::operator new and calls the frame class's operator delete a mismatch: a false positive, as in
// src/redis/async_sentinel.cc.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace mq {
namespace {

using Clock = std::chrono::steady_clock;
using Args = std::vector<std::string>;

// One Redis connection on the loop, used by one coroutine at a time: a pipeline of commands goes
// out in one write and their replies come back in order.
class RespConnection {
 public:
  explicit RespConnection(const asio::any_io_executor& executor)
      : socket_(executor), reader_(redisReaderCreate()) {
    if (!reader_) throw std::bad_alloc();
  }

  asio::awaitable<void> connect(const RedisAddress& a) {
    asio::ip::tcp::resolver resolver(socket_.get_executor());
    const auto endpoints =
        co_await resolver.async_resolve(a.host, std::to_string(a.port), asio::use_awaitable);
    co_await asio::async_connect(socket_, endpoints, asio::use_awaitable);
    socket_.set_option(asio::ip::tcp::no_delay(true));
    std::vector<Args> hello;
    if (!a.password.empty()) hello.push_back({"AUTH", a.password});
    if (!a.db.empty() && a.db != "0") hello.push_back({"SELECT", a.db});
    if (!hello.empty()) co_await pipeline(hello);
  }

  // Sends `commands` in one write and returns their replies in order. Throws std::runtime_error
  // for an error reply (after reading every reply, so the connection stays in step) and
  // std::system_error when the connection fails.
  asio::awaitable<std::vector<Reply>> pipeline(const std::vector<Args>& commands) {
    std::string out;
    for (const Args& args : commands) {
      std::vector<const char*> argv;
      std::vector<size_t> lengths;
      for (const std::string& a : args) {
        argv.push_back(a.data());
        lengths.push_back(a.size());
      }
      char* command = nullptr;
      const int length = redisFormatCommandArgv(&command, static_cast<int>(args.size()),
                                                argv.data(), lengths.data());
      if (length < 0) throw std::bad_alloc();
      out.append(command, static_cast<std::size_t>(length));
      redisFreeCommand(command);
    }
    co_await asio::async_write(socket_, asio::buffer(out), asio::use_awaitable);
    std::vector<Reply> replies;
    while (replies.size() < commands.size()) {
      void* raw = nullptr;
      if (redisReaderGetReply(reader_.get(), &raw) != REDIS_OK)
        throw std::runtime_error(std::string("redis: protocol error: ") + reader_->errstr);
      if (raw != nullptr) {
        replies.emplace_back(static_cast<redisReply*>(raw));
        continue;
      }
      const std::size_t n =
          co_await socket_.async_read_some(asio::buffer(buffer_), asio::use_awaitable);
      redisReaderFeed(reader_.get(), buffer_.data(), n);
    }
    for (const Reply& r : replies) {
      if (r->type == REDIS_REPLY_ERROR) throw std::runtime_error("redis: " + text(r.get()));
    }
    co_return replies;
  }

  void close() {
    asio::error_code ignored;
    socket_.close(ignored);
  }

 private:
  struct ReaderDeleter {
    void operator()(redisReader* r) const noexcept { redisReaderFree(r); }
  };
  asio::ip::tcp::socket socket_;
  std::unique_ptr<redisReader, ReaderDeleter> reader_;
  std::array<char, 16 * 1024> buffer_{};
};

// The business effect in the call's transaction; every argument by value (the coroutine's frame
// owns them).
asio::awaitable<std::string> book(idem::AsyncTransaction& tx, std::string schema,
                                  std::string entry_id, idem::Request request) {
  std::vector<std::optional<std::string>> row{request.request_id, std::move(entry_id), request.user,
                                              request.payload};
  const idem::AsyncResult r = co_await tx.exec(ledger_insert_sql(schema), std::move(row));
  // Its result is not needed: staged, it goes with idem's record and COMMIT.
  tx.stage(totals_upsert_sql(schema), {request.user, std::string(r.get(0, 1).value())});
  co_return "ledger entry " + std::string(r.get(0, 0).value());
}

class AsyncConsumer {
 public:
  AsyncConsumer(asio::io_context& io, Settings s)
      : io_(io), s_(std::move(s)), redis_(io.get_executor()), wake_(io) {
    schema_ = create_tables(s_);
    idem::PgSink(sink_options(s_)).migrate();  // the async sink does not create its table
    idem::AsyncDeduplicatorOptions options;
    options.redis = guard_options(s_);
    options.postgres = sink_options(s_);  // --pg-connections: transactions open at once
    options.deadline = s_.lease;          // an entry that takes longer is left for redelivery
    // A repeat of an entry still in flight here (a producer's retry in the same batch) waits on
    // the loop for the first one's result and is XACKed as a duplicate, instead of waiting
    // --claim-idle-ms for XAUTOCLAIM. A repeat of a crashed consumer's entry still answers
    // in progress after this wait, and is redelivered.
    options.base.on_concurrent_duplicate = idem::ConcurrentDuplicatePolicy::kWaitForResult;
    options.base.wait_for_result = s_.lease / 2;
    dedup_ = std::make_unique<idem::AsyncDeduplicator>(io.get_executor(), std::move(options));
  }

  // Reads, dispatches and acknowledges until a stop condition; then waits for the calls in flight
  // and sends their XACKs.
  asio::awaitable<void> pump() {
    co_await redis_.connect(parse_redis_url(s_.service.redis_url));
    // Named first: GCC 12 rejects a braced temporary in a co_await ("array used as initializer").
    const std::vector<Args> create{{"XGROUP", "CREATE", s_.stream, s_.group, "0", "MKSTREAM"}};
    try {
      co_await redis_.pipeline(create);
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()).find("BUSYGROUP") == std::string::npos) throw;
    }
    const auto start = Clock::now();
    auto last_read = start;
    auto next_reclaim = start;
    auto next_report = start + std::chrono::seconds(2);
    while (!stopping_ && (s_.max_run.count() == 0 || Clock::now() - start < s_.max_run)) {
      std::vector<Args> commands;
      const std::size_t acks = take_acks(commands);
      const long long free = s_.in_flight - in_flight_;
      bool reclaim = false;
      if (free > 0) {
        reclaim = Clock::now() >= next_reclaim;
        const long long count = std::min(free, s_.batch);
        if (reclaim) {
          commands.push_back(autoclaim_command(s_, autoclaim_cursor_, count));
          next_reclaim = Clock::now() + s_.claim_idle / 2;
        } else {
          // BLOCK only when nothing is in flight: a call finishing must not wait for new entries.
          const bool idle = in_flight_ == 0 && acks == 0;
          commands.push_back(read_group_command(s_, count, idle ? s_.block : milliseconds(0)));
        }
      }
      std::size_t dispatched = 0;
      if (!commands.empty()) {
        const std::vector<Reply> replies = co_await redis_.pipeline(commands);
        counts_["acked"] += static_cast<long long>(acks);
        if (free > 0) dispatched = dispatch(replies.back().get(), reclaim);
      }
      if (dispatched > 0) {
        last_read = Clock::now();
      } else if (reclaim) {
        continue;  // nothing to take over: read new entries at once
      } else if (in_flight_ > 0) {
        co_await wait_for_a_call(s_.block);
      } else if (acks_.empty() && s_.exit_when_idle.count() > 0 &&
                 Clock::now() - last_read >= s_.exit_when_idle && co_await pending() == 0) {
        break;
      }
      if (Clock::now() >= next_report) {
        report("progress", s_, counts_);
        next_report = Clock::now() + std::chrono::seconds(2);
      }
    }
    while (in_flight_ > 0) co_await wait_for_a_call(std::chrono::seconds(1));
    std::vector<Args> last;
    if (const std::size_t acks = take_acks(last); acks > 0) {
      co_await redis_.pipeline(last);
      counts_["acked"] += static_cast<long long>(acks);
    }
    report("done", s_, counts_);
  }

  // SIGINT/SIGTERM: read no more, finish the bookings under way; the calls whose booking has not
  // started are cancelled (their claims released, their entries left pending for another
  // consumer).
  void stop() {
    stopping_ = true;
    for (Call& call : calls_) {
      if (!call.booking) call.cancel.emit(asio::cancellation_type::terminal);
    }
    wake();
  }

  void close() {
    redis_.close();
    dedup_->close();
    wake_.cancel();
  }

 private:
  // A call in flight: its cancellation, and whether its booking (the handler) started.
  struct Call {
    asio::cancellation_signal cancel;
    bool booking = false;
  };

  // Moves the XACKs gathered so far into one command of `commands`; returns how many.
  std::size_t take_acks(std::vector<Args>& commands) {
    if (acks_.empty()) return 0;
    const std::size_t n = acks_.size();
    Args xack{"XACK", s_.stream, s_.group};
    xack.insert(xack.end(), std::make_move_iterator(acks_.begin()),
                std::make_move_iterator(acks_.end()));
    acks_.clear();
    commands.push_back(std::move(xack));
    return n;
  }

  // Starts a call per entry of an XREADGROUP or XAUTOCLAIM reply; returns how many.
  std::size_t dispatch(const redisReply* reply, bool reclaimed) {
    std::vector<Entry> entries;
    if (reclaimed) {
      autoclaim_cursor_ = text(reply->element[0]);  // "0-0" once the whole PEL was scanned
      entries = parse_entries(reply->element[1]);
      counts_["reclaimed"] += static_cast<long long>(entries.size());
    } else {
      entries = read_group_entries(reply);
    }
    for (Entry& e : entries) {
      ++in_flight_;
      const auto call = calls_.emplace(calls_.end());
      asio::co_spawn(io_, handle(std::move(e), reclaimed, *call),
                     asio::bind_cancellation_slot(
                         call->cancel.slot(), [this, call](const std::exception_ptr& error) {
                           // Dropped once this handler has returned: the signal owns it.
                           asio::post(io_, [this, call] { calls_.erase(call); });
                           --in_flight_;
                           wake();
                           if (error) std::rethrow_exception(error);  // a bug in handle()
                         }));
    }
    return entries.size();
  }

  asio::awaitable<void> handle(Entry e, bool reclaimed, Call& call) {
    ++counts_["delivered"];
    const idem::Request request = to_request(e, reclaimed);
    // Named first: GCC 12 destroys a lambda temporary inside a co_await expression twice.
    auto booking = [schema = schema_, id = e.id, request, &call](idem::AsyncTransaction& tx) {
      call.booking = true;
      return book(tx, schema, id, request);
    };
    idem::Outcome outcome;
    try {
      outcome =
          co_await dedup_->run_transactional(request, std::move(booking), asio::use_awaitable);
    } catch (const idem::Error& error) {
      if (stopping_ && !call.booking && dynamic_cast<const idem::Cancelled*>(&error) != nullptr) {
        ++counts_["left_at_stop"];  // cancelled by the stop before its booking: left pending
        co_return;
      }
      // A backend failed mid-call or the deadline passed (left pending), or the entry can never
      // be booked.
      ++counts_["errors"];
      std::cout << "error entry=" << e.id << ": " << error.what() << std::endl;
      if (settle(error) == Settle::kRedeliver) co_return;
      print_dead_letter(e, request, error.what());
      acks_.push_back(e.id);
      ++counts_["dead_lettered"];
      co_return;
    }
    ++counts_[std::string(to_string(outcome.kind))];
    const Settle what = settle(outcome.kind);
    if (what == Settle::kRedeliver) co_return;
    if (what == Settle::kDeadLetter)
      print_dead_letter(e, request, "request ID reused with another payload");
    acks_.push_back(e.id);  // sent with pump's next round trip, after the commit
  }

  void wake() {
    woken_ = true;
    wake_.cancel();
  }

  // Until a call finishes (or stop()), at most `limit`.
  asio::awaitable<void> wait_for_a_call(milliseconds limit) {
    if (!woken_) {
      wake_.expires_after(limit);
      asio::error_code ignored;
      co_await wake_.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
    }
    woken_ = false;
  }

  asio::awaitable<long long> pending() {
    const std::vector<Args> xpending{{"XPENDING", s_.stream, s_.group}};
    const std::vector<Reply> r = co_await redis_.pipeline(xpending);
    co_return r[0]->element[0]->integer;
  }

  asio::io_context& io_;
  Settings s_;
  RespConnection redis_;
  asio::steady_timer wake_;
  bool woken_ = false;
  bool stopping_ = false;
  std::string schema_;  // quoted
  std::unique_ptr<idem::AsyncDeduplicator> dedup_;
  long long in_flight_ = 0;
  std::list<Call> calls_;  // the calls in flight (a node is dropped after its call completed)
  std::vector<std::string> acks_;  // entry IDs whose effect committed, not yet XACKed
  std::string autoclaim_cursor_ = "0-0";
  std::map<std::string, long long> counts_;
};

}  // namespace

int consume_async(const Settings& s) {
  asio::io_context io(1);
  AsyncConsumer consumer(io, s);
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&consumer](const asio::error_code& error, int) {
    if (!error) consumer.stop();
  });
  std::exception_ptr failure;
  asio::co_spawn(io, consumer.pump(), [&](const std::exception_ptr& error) {
    failure = error;
    signals.cancel();
    consumer.close();  // idle connections would keep io.run() going
  });
  io.run();
  if (failure) std::rethrow_exception(failure);
  return 0;
}

}  // namespace mq
