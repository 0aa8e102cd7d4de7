// dtrain's communicator as a c10d::ProcessGroup: what
// torch.distributed.init_process_group("dtrain") and new_group make, one
// per group, each joined through the group's own store
// (dt_comm_init_external). Every collective is one of dtrain's
// non-blocking calls; the Work it returns completes on the Completer
// thread (work.hpp).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "store_ops.hpp"
#include "work.hpp"

namespace dtrain_torch {

class ProcessGroupDtrain : public c10d::ProcessGroup {
  public:
    ProcessGroupDtrain(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                       std::chrono::milliseconds timeout);
    ~ProcessGroupDtrain() override;

    const std::string getBackendName() const override { return "dtrain"; }
    // "shm", "tcp", "shm+tcp" or "self": what carries the group's messages.
    std::string transport() const { return dt_comm_transport(comm_); }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                             const c10d::BroadcastOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                             const c10d::AllreduceOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
        std::vector<at::Tensor> &tensors, const c10d::AllreduceCoalescedOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                          const c10d::ReduceOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                             std::vector<at::Tensor> &inputs,
                                             const c10d::AllgatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                   const c10d::AllgatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> allgather_coalesced(
        std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
        const c10d::AllgatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                          std::vector<at::Tensor> &inputs,
                                          const c10d::GatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                           std::vector<std::vector<at::Tensor>> &inputs,
                                           const c10d::ScatterOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> reduce_scatter(
        std::vector<at::Tensor> &outputs, std::vector<std::vector<at::Tensor>> &inputs,
        const c10d::ReduceScatterOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
        at::Tensor &output, at::Tensor &input, const c10d::ReduceScatterOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                                 std::vector<int64_t> &output_splits,
                                                 std::vector<int64_t> &input_splits,
                                                 const c10d::AllToAllOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs,
                                            std::vector<at::Tensor> &inputs,
                                            const c10d::AllToAllOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dst,
                                        int tag) override;
    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int src,
                                        int tag) override;
    c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &tensors,
                                                 int tag) override;

    // The number of collectives issued on the group: every rank that made
    // the same calls has the same number, so ranks that differ have fallen
    // out of step (gloo's and NCCL's desync check). It starts at 0 on every
    // rank when the group is made, so the ranks agree without messages;
    // setting it starts it again at 0, which every rank does at the same
    // point of the program.
    void setSequenceNumberForGroup() override { seq_ = 0; }
    uint64_t getSequenceNumberForGroup() override { return seq_; }

  private:
    // Issues a call (start fills work->request with one of dtrain's
    // non-blocking calls, returning its status) and queues its Work.
    c10::intrusive_ptr<c10d::Work> issue(c10::intrusive_ptr<WorkDtrain> work,
                                         const std::function<int(dt_request **)> &start);
    c10::intrusive_ptr<WorkDtrain> make_work(c10d::OpType type, const char *name,
                                             std::vector<at::Tensor> outputs,
                                             std::vector<at::Tensor> keep,
                                             std::function<void()> then = nullptr,
                                             int source_rank = -1);
    c10::intrusive_ptr<c10d::Work> alltoallv(at::Tensor send, at::Tensor recv,
                                             c10::intrusive_ptr<WorkDtrain> work,
                                             std::vector<size_t> send_counts,
                                             std::vector<size_t> recv_counts);

    std::unique_ptr<StoreRef> store_;
    dt_comm *comm_ = nullptr;
    std::mutex issue_mu_; // a communicator takes its calls from one thread at a time
    std::atomic<uint64_t> seq_{0}; // collectives issued (getSequenceNumberForGroup)
    std::unique_ptr<Completer> completer_;
};

// The Python side's creator: torch.distributed hands it the group's store,
// rank, size and timeout.
c10::intrusive_ptr<ProcessGroupDtrain> create_process_group(
    const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
    std::chrono::milliseconds timeout);

} // namespace dtrain_torch
