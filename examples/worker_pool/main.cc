// idem-worker-pool: a thread pool fed through RedisGuard::claim_batch.
//
// A dispatcher takes inbound tasks (email jobs, some delivered twice: a broker's redelivery with
// the same request ID, or a client's resubmission with a new one) in batches, claims the keys of
// a whole batch in one pipelined round trip, prints each message's answer, and hands only the
// claimed tasks to the pool. Each task runs inside its request's context (idem::RequestContext
// ::bind), so code deep in a worker thread logs the right request ID without it being passed
// down. A worker completes its claim with the result, or releases it on failure so that the
// redelivered task runs again. The dispatcher claims a batch only once fewer than --threads
// claimed tasks wait or run, so no claim waits in the queue long enough to outlive its lease. On
// SIGINT or SIGTERM it claims nothing more: the tasks claimed finish, the summary is printed, and
// the tasks not dispatched hold no claim.
//
//   idem-worker-pool [--redis-url URL] [--ns worker-pool] [--run ID] [--tasks 200]
//                    [--threads 4] [--batch 32] [--seed 1]
// The URL defaults to IDEM_TEST_REDIS_URL. Run it twice with the same --run: the second run finds
// every task completed and runs none.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/flags.h"
#include "idem/errors.h"
#include "idem/key.h"
#include "idem/redis_guard.h"
#include "idem/request_context.h"

namespace {

struct Settings {
  std::string redis_url;
  std::string ns = "worker-pool";
  std::string run = std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
  int tasks = 200;
  int threads = 4;
  std::size_t batch = 32;
  unsigned seed = 1;
};

Settings parse_settings(int argc, char** argv) {
  Settings s;
  CLI::App app{
      "idem-worker-pool: a thread pool fed through RedisGuard::claim_batch; run it twice with the "
      "same --run and the second run executes nothing.",
      "idem-worker-pool"};
  examples::add_redis_url(app, s.redis_url);
  app.add_option("--ns", s.ns, "idem namespace of the keys")->capture_default_str();
  app.add_option("--run", s.run, "ID of this run's tasks (default: the current time)");
  examples::add_positive_option(app, "--tasks", s.tasks, "Distinct tasks (jobs)");
  examples::add_positive_option(app, "--threads", s.threads, "Worker threads");
  examples::add_positive_option(app, "--batch", s.batch,
                                "Messages claimed per RedisGuard::claim_batch");
  app.add_option("--seed", s.seed, "Seed of the redeliveries and their order")
      ->capture_default_str();
  examples::parse_or_exit(app, argc, argv);
  return s;
}

// Set by SIGINT or SIGTERM: the dispatcher claims nothing more.
std::atomic<bool> stop_requested{false};

// The number of the pool thread running the caller (1-based; 0 outside the pool).
thread_local int worker_number = 0;

// A fixed pool of threads running submitted jobs in order of submission.
class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int i = 0; i < threads; ++i) {
      workers_.emplace_back([this, i] {
        worker_number = i + 1;
        for (std::function<void()> job; take(job);) job();
      });
    }
  }
  ~ThreadPool() {
    {
      const std::lock_guard lock(mutex_);
      closing_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();  // runs every job submitted before
  }
  void submit(std::function<void()> job) {
    {
      const std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    wake_.notify_one();
  }

 private:
  bool take(std::function<void()>& job) {
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [this] { return closing_ || !jobs_.empty(); });
    if (jobs_.empty()) return false;
    job = std::move(jobs_.front());
    jobs_.pop_front();
    return true;
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool closing_ = false;
  std::vector<std::thread> workers_;
};

struct Task {
  std::string request_id;  // one delivery chain of a request; a resubmission has a new one
  std::string user;
  std::string job;          // the business identity: one email per job
  bool fails_once = false;  // a transient failure on its first run
};

// What the workers did, shared by all threads.
class Ledger {
 public:
  void print(const std::string& line) {
    const std::lock_guard lock(mutex_);
    std::cout << line << std::endl;
  }
  void count(const std::string& what) {
    const std::lock_guard lock(mutex_);
    ++counts_[what];
  }
  void effect(const std::string& job) {
    const std::lock_guard lock(mutex_);
    ++effects_[job];
  }
  // Claimed tasks handed to the pool and not finished yet.
  void started() {
    const std::lock_guard lock(mutex_);
    ++in_flight_;
  }
  // A task finished; a failed one is requeued (redelivered) for the dispatcher.
  void finished(std::optional<Task> failed) {
    {
      const std::lock_guard lock(mutex_);
      if (failed) requeued_.push_back(std::move(*failed));
      --in_flight_;
    }
    changed_.notify_all();
  }
  // Waits until fewer than `limit` claimed tasks wait or run (back-pressure on the claims).
  void wait_below(int limit) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return in_flight_ < limit; });
  }
  // A repeat of a job still running: delivered again with the next batch.
  void requeue(Task task) {
    const std::lock_guard lock(mutex_);
    requeued_.push_back(std::move(task));
  }
  // Requeued tasks, and whether more may come (tasks still running).
  std::pair<std::vector<Task>, bool> take_requeued() {
    const std::lock_guard lock(mutex_);
    return {std::exchange(requeued_, {}), in_flight_ > 0};
  }
  void summary(std::size_t deliveries) {
    const std::lock_guard lock(mutex_);
    long long duplicate_effects = 0;
    for (const auto& [job, n] : effects_) duplicate_effects += n - 1;
    std::cout << "summary deliveries=" << deliveries << " jobs_run=" << effects_.size()
              << " duplicate_effects=" << duplicate_effects;
    for (const auto& [what, n] : counts_) std::cout << " " << what << "=" << n;
    std::cout << std::endl;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;  // in_flight_ went down
  std::map<std::string, long long> counts_;
  std::map<std::string, long long> effects_;
  std::vector<Task> requeued_;
  int in_flight_ = 0;
};

// The inbound deliveries: every job once, then redeliveries (same request ID) and resubmissions
// (new request ID, same job) mixed in, some of them in the same batch as the original.
std::deque<Task> make_deliveries(const Settings& s) {
  std::mt19937 random(s.seed);
  std::vector<Task> tasks;
  for (int i = 0; i < s.tasks; ++i) {
    tasks.push_back({"req-" + s.run + "-" + std::to_string(i), "u" + std::to_string(i % 10),
                     "email-" + s.run + "-" + std::to_string(i), i % 25 == 7});
  }
  std::vector<Task> deliveries = tasks;
  for (int i = 0; i < s.tasks / 4; ++i) {
    Task copy = tasks[random() % tasks.size()];
    if (i % 2 == 1) copy.request_id += "-resubmitted";
    copy.fails_once = false;
    deliveries.push_back(copy);
  }
  std::shuffle(deliveries.begin(), deliveries.end(), random);
  return {deliveries.begin(), deliveries.end()};
}

std::string describe(const idem::ClaimResult& r) {
  switch (r.status) {
    case idem::ClaimStatus::kFirst:
      return "FIRST -> run";
    case idem::ClaimStatus::kRepeatSame:
      return r.state == idem::RecordState::kCompleted
                 ? "REPEAT_SAME completed -> skip (redelivery)"
                 : "REPEAT_SAME in_progress -> requeue (redelivery while running)";
    case idem::ClaimStatus::kRepeatOther:
      return r.state == idem::RecordState::kCompleted
                 ? "REPEAT_OTHER completed -> skip (resubmission)"
                 : "REPEAT_OTHER in_progress -> requeue (resubmission while running)";
  }
  return "?";
}

// The business work, deep inside a worker thread: it finds the request ID in the thread's
// context, not in its arguments.
std::string send_email(const Task& task, Ledger& ledger, int attempt) {
  if (task.fails_once && attempt == 1) throw std::runtime_error("mail server busy");
  ledger.print("  worker " + std::to_string(worker_number) + " request_id=" +
               idem::current_request_id() + " sent " + task.job + " to " + task.user);
  if (idem::current_request_id() != task.request_id) ledger.count("context_mismatches");
  ledger.effect(task.job);
  return "sent " + task.job;
}

}  // namespace

int main(int argc, char** argv) {
  const Settings s = parse_settings(argc, argv);
  struct sigaction on_stop {};
  on_stop.sa_handler = [](int) { stop_requested = true; };
  sigaction(SIGINT, &on_stop, nullptr);
  sigaction(SIGTERM, &on_stop, nullptr);
  try {
    idem::RedisGuardOptions options;
    options.redis.url = s.redis_url;
    options.redis.pool_size = static_cast<std::size_t>(s.threads) + 1;
    options.ns = s.ns;
    options.lease = std::chrono::seconds(30);
    options.retention = std::chrono::hours(1);
    idem::RedisGuard guard(options);
    Ledger ledger;
    std::deque<Task> inbound = make_deliveries(s);
    std::size_t deliveries = 0;
    std::map<std::string, int> attempts;  // per request ID; dispatcher thread only
    ThreadPool pool(s.threads);
    for (int batch_no = 1;; ++batch_no) {
      ledger.wait_below(s.threads);
      if (stop_requested) {
        ledger.print("stopping: " + std::to_string(inbound.size()) +
                     " deliveries not dispatched, none of them claimed");
        ledger.wait_below(1);  // the claimed tasks finish
        break;
      }
      auto [requeued, running] = ledger.take_requeued();
      inbound.insert(inbound.end(), requeued.begin(), requeued.end());
      if (inbound.empty()) {
        if (!running) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a failed task may come back
        continue;
      }
      std::vector<Task> batch;
      std::vector<std::string> keys;
      while (!inbound.empty() && batch.size() < s.batch) {
        batch.push_back(std::move(inbound.front()));
        inbound.pop_front();
        keys.push_back(
            idem::IdempotencyKey{batch.back().user, "send-email", batch.back().job}.encode());
      }
      deliveries += batch.size();
      std::vector<idem::ClaimRequest> requests;
      for (std::size_t i = 0; i < batch.size(); ++i)
        requests.push_back({keys[i], batch[i].request_id, ""});
      const std::vector<idem::ClaimResult> claims = guard.claim_batch(requests);  // one round trip

      ledger.print("batch " + std::to_string(batch_no) + ": " + std::to_string(batch.size()) +
                   " messages");
      bool waiting = false;
      for (std::size_t i = 0; i < batch.size(); ++i) {
        ledger.print("  " + batch[i].request_id + " " + describe(claims[i]));
        if (claims[i].status != idem::ClaimStatus::kFirst &&
            claims[i].state == idem::RecordState::kInProgress) {
          // Never drop a repeat of a job still running: if that run fails (or its process
          // dies), this copy is the one that must run. Back to the queue, asked again later.
          ledger.count("requeued");
          ledger.requeue(batch[i]);
          waiting = true;
          continue;
        }
        ledger.count(claims[i].status == idem::ClaimStatus::kFirst ? "claimed" : "skipped");
        if (claims[i].status != idem::ClaimStatus::kFirst) continue;
        ledger.started();
        const int attempt = ++attempts[batch[i].request_id];
        // bind() carries the request's context to whichever worker thread runs the job.
        pool.submit(idem::RequestContext(batch[i].request_id)
                        .bind([&guard, &ledger, task = batch[i], key = keys[i],
                               token = claims[i].owner_token, attempt] {
                          std::string result;
                          try {
                            result = send_email(task, ledger, attempt);
                          } catch (const std::exception& e) {
                            ledger.print("  request_id=" + idem::current_request_id() +
                                         " failed (" + e.what() +
                                         "): claim released, task redelivered");
                            ledger.count("released");
                            try {
                              (void)guard.release(key, token);
                            } catch (const idem::Error&) {
                              // Redis is away: the claim ends with its lease instead.
                            }
                            ledger.finished(task);
                            return;
                          }
                          try {
                            (void)guard.complete(key, token, result);
                          } catch (const idem::Error& e) {
                            // The effect happened; the record stays IN_PROGRESS until its lease
                            // ends.
                            ledger.print("  request_id=" + idem::current_request_id() +
                                         " complete failed: " + e.what());
                          }
                          ledger.finished(std::nullopt);
                        }));
      }
      if (waiting) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ledger.summary(deliveries);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "idem-worker-pool: error: " << e.what() << "\n";
    return 1;
  }
}
