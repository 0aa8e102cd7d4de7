// The Work a collective returns, and the thread that completes them.
//
// Each collective is issued as one of dtrain's non-blocking calls, which
// its progress thread runs in issue order. A Completer thread per process
// group waits for them in that order (dt_wait), runs what must follow
// (copying results into non-contiguous or listed outputs), then completes
// the Work and its Future: DDP waits on Futures, which nobody would
// complete if only Work::wait looked at the request.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "dtrain/comm.h"
}

namespace dtrain_torch {

class WorkDtrain : public c10d::Work {
  public:
    // outputs: what result() and the Future give; keep: buffers dtrain
    // reads or writes until the request completes; then: run once it
    // succeeded, before anyone sees it complete.
    WorkDtrain(int rank, c10d::OpType type, const char *name, std::vector<at::Tensor> outputs,
               std::vector<at::Tensor> keep, std::function<void()> then, int source = -1);

    const std::string &name() const { return name_; }
    std::vector<at::Tensor> result() override;
    // Polls a while before it sleeps (poll_until): a small collective
    // completes sooner than a sleeping thread wakes.
    bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
    int sourceRank() const override;

    // The Completer's: dtrain's status of the request and, on failure, its
    // message.
    void complete(int status, const std::string &message);

    dt_request *request = nullptr;
    // Count and displacement arrays an all-to-all-v reads until it ends.
    std::vector<size_t> counts;
    // A receive's peer: named, or written by dtrain once a receive from
    // any source has chosen its sender (read after the Work completed).
    int source_rank;

  private:
    std::string name_;
    std::vector<at::Tensor> outputs_;
    std::vector<at::Tensor> keep_;
    std::function<void()> then_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Polls done() for up to about 100 us, yielding the core between looks:
// true once it holds. A hand-over between threads costs a wake-up only
// when the other side takes longer than that (libdtrain's waits do the
// same, comm/async.c).
bool poll_until(const std::function<bool()> &done);

class Completer {
  public:
    explicit Completer(dt_comm *comm);
    // Waits for every queued request, then stops the thread.
    ~Completer();
    void push(c10::intrusive_ptr<WorkDtrain> work);

  private:
    void run();
    dt_comm *comm_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<c10::intrusive_ptr<WorkDtrain>> queue_;
    std::atomic<unsigned> pushed_{0};
    bool stop_ = false;
    std::thread thread_;
};

} // namespace dtrain_torch
