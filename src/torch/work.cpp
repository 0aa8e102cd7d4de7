// The Work of a collective and the thread that completes them (work.hpp).
#include "work.hpp"

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <pybind11/pybind11.h>

#include <chrono>
#include <exception>
#include <stdexcept>
#include <thread>
#include <string>
#include <unordered_map>
#include <utility>

namespace dtrain_torch {

// "dtrain:<op>", the span PyTorch's profiler records from the issue to the
// completion of each collective, as it records "gloo:<op>" for gloo's. The
// profiler keeps the pointer, so each title is made once and kept.
static const char *profiling_title(const char *name)
{
    static std::mutex mu;
    static std::unordered_map<std::string, std::string> titles;
    std::lock_guard<std::mutex> lock(mu);
    auto it = titles.emplace(name, std::string("dtrain:") + name).first;
    return it->second.c_str();
}

WorkDtrain::WorkDtrain(int rank, c10d::OpType type, const char *name,
                       std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
                       std::function<void()> then, int source)
    : c10d::Work(rank, type, profiling_title(name)), source_rank(source), name_(name),
      outputs_(std::move(outputs)), keep_(std::move(keep)), then_(std::move(then)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get())))
{
}

std::vector<at::Tensor> WorkDtrain::result() { return outputs_; }

bool poll_until(const std::function<bool()> &done)
{
    const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
    do {
        if (done()) return true;
        std::this_thread::yield();
    } while (std::chrono::steady_clock::now() < end);
    return false;
}

bool WorkDtrain::wait(std::chrono::milliseconds timeout)
{
    poll_until([this] { return isCompleted(); });
    return c10d::Work::wait(timeout);
}

c10::intrusive_ptr<c10::ivalue::Future> WorkDtrain::getFuture() { return future_; }

int WorkDtrain::sourceRank() const { return source_rank; }

void WorkDtrain::complete(int status, const std::string &message)
{
    std::exception_ptr error;
    if (status == 0 && then_) {
        try {
            then_();
        } catch (...) {
            error = std::current_exception();
        }
    } else if (status != 0) {
        error = std::make_exception_ptr(
            std::runtime_error("dtrain " + name_ + " failed: " + message));
    }
    keep_.clear();
    then_ = nullptr;
    if (error)
        future_->setError(error);
    else
        future_->markCompleted(c10::IValue(outputs_));
    finish(error);
}

Completer::Completer(dt_comm *comm) : comm_(comm), thread_([this] { run(); }) {}

Completer::~Completer()
{
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    // The thread drops its reference to each Work it completed, and may
    // need the GIL for that: a tensor that Python let go of while a Work
    // still held it keeps its Python object alive, freed with the tensor.
    // A group deleted from Python would join it holding the GIL, and wait
    // forever.
    if (Py_IsInitialized() && PyGILState_Check()) {
        pybind11::gil_scoped_release no_gil;
        thread_.join();
    } else {
        thread_.join();
    }
}

void Completer::push(c10::intrusive_ptr<WorkDtrain> work)
{
    {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(work));
    }
    pushed_.fetch_add(1, std::memory_order_release);
    cv_.notify_all();
}

void Completer::run()
{
    for (;;) {
        c10::intrusive_ptr<WorkDtrain> work;
        const unsigned seen = pushed_.load(std::memory_order_acquire);
        {
            std::unique_lock<std::mutex> lock(mu_);
            if (!stop_ && queue_.empty()) { // idle: poll a while, then sleep
                lock.unlock();
                poll_until([&] { return pushed_.load(std::memory_order_acquire) != seen; });
                lock.lock();
            }
            cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;
            work = std::move(queue_.front());
            queue_.pop_front();
        }
        int status = dt_wait(work->request);
        work->request = nullptr;
        work->complete(status, status ? dt_comm_error(comm_) : "");
    }
}

} // namespace dtrain_torch
