// dtrain's communicator as a c10d::ProcessGroup (process_group.hpp). Each
// collective checks its tensors, lays them out as dtrain's call wants
// (contiguous, lists flattened into one buffer) and issues the call;
// what must be copied back into the caller's tensors runs once it
// succeeded, on the Completer thread.
#include "process_group.hpp"

#include <c10/util/Exception.h>

#include <utility>

#include "tensors.hpp"

namespace dtrain_torch {

using c10d::OpType;

namespace {

// "then" for an output that dtrain wrote through a contiguous stand-in.
std::function<void()> copy_back(const at::Tensor &out, const at::Tensor &buf)
{
    if (buf.is_same(out)) return nullptr;
    return [out, buf]() mutable { out.copy_(buf); };
}

void check_root(int64_t root, int size, const char *collective)
{
    TORCH_CHECK(root >= 0 && root < size, "dtrain ", collective, ": root ", root,
                " is not a rank of the group (0 to ", size - 1, ")");
}

void check_same_dtype(const at::Tensor &a, const at::Tensor &b, const char *collective)
{
    TORCH_CHECK(a.scalar_type() == b.scalar_type(), "dtrain ", collective, ": the output is ",
                b.scalar_type(), " and the input ", a.scalar_type(), "; they must match");
}

// Elements for each rank along dim 0 of t: its split sizes, or equal
// parts when there are none.
std::vector<size_t> split_counts(const std::vector<int64_t> &splits, const at::Tensor &t,
                                 int size, const char *what)
{
    TORCH_CHECK(t.dim() >= 1, "dtrain alltoall_base: the ", what, " is a scalar; it needs a "
                "dim 0 to split among the ranks");
    int64_t rows = t.size(0), row = rows ? t.numel() / rows : 0;
    std::vector<size_t> counts(static_cast<size_t>(size));
    if (splits.empty()) {
        TORCH_CHECK(rows % size == 0, "dtrain alltoall_base: dim 0 of the ", what, " (", rows,
                    ") does not divide among the group's ", size, " ranks; give split sizes");
        for (auto &c : counts) c = static_cast<size_t>(rows / size * row);
        return counts;
    }
    TORCH_CHECK(splits.size() == counts.size(), "dtrain alltoall_base: ", splits.size(), " ",
                what, " split sizes for a group of ", size, " ranks");
    int64_t sum = 0;
    for (size_t i = 0; i < splits.size(); i++) {
        TORCH_CHECK(splits[i] >= 0, "dtrain alltoall_base: ", what, " split size ", splits[i],
                    " is negative");
        sum += splits[i];
        counts[i] = static_cast<size_t>(splits[i] * row);
    }
    TORCH_CHECK(sum == rows, "dtrain alltoall_base: the ", what, " split sizes sum to ", sum,
                ", not to its dim 0 (", rows, ")");
    return counts;
}

std::vector<size_t> numels(const std::vector<at::Tensor> &ts)
{
    std::vector<size_t> n;
    for (const auto &t : ts) n.push_back(static_cast<size_t>(t.numel()));
    return n;
}

} // namespace

ProcessGroupDtrain::ProcessGroupDtrain(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                                       int size, std::chrono::milliseconds timeout)
    : ProcessGroup(rank, size), store_(new StoreRef{store})
{
    double timeout_s = static_cast<double>(timeout.count()) / 1000.0;
    int rc = dt_comm_init_external(&store_ops, store_.get(), rank, size, timeout_s, &comm_);
    TORCH_CHECK(rc == 0, "dtrain: rank ", rank, " of ", size, " could not join the process "
                "group: ", dt_last_error());
    completer_.reset(new Completer(comm_));
}

ProcessGroupDtrain::~ProcessGroupDtrain()
{
    completer_.reset(); // every request waited for
    dt_comm_destroy(comm_);
}

c10::intrusive_ptr<WorkDtrain> ProcessGroupDtrain::make_work(
    OpType type, const char *name, std::vector<at::Tensor> outputs, std::vector<at::Tensor> keep,
    std::function<void()> then, int source_rank)
{
    return c10::make_intrusive<WorkDtrain>(getRank(), type, name, std::move(outputs),
                                           std::move(keep), std::move(then), source_rank);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::issue(
    c10::intrusive_ptr<WorkDtrain> work, const std::function<int(dt_request **)> &start)
{
    std::lock_guard<std::mutex> lock(issue_mu_);
    int rc = start(&work->request);
    TORCH_CHECK(rc == 0, "dtrain ", work->name(), ": ", dt_comm_error(comm_));
    const OpType type = work->retrieveOpType();
    if (type != OpType::SEND && type != OpType::RECV && type != OpType::RECVANYSOURCE) seq_++;
    completer_->push(work);
    return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::allreduce(std::vector<at::Tensor> &tensors,
                                                             const c10d::AllreduceOptions &opts)
{
    at::Tensor t = single(tensors, "allreduce");
    Reduction red = reduction_of(t.scalar_type(), opts.reduceOp, "allreduce");
    at::Tensor buf = contiguous_of(t);
    auto work = make_work(OpType::ALLREDUCE, "allreduce", {t}, {buf}, copy_back(t, buf));
    void *p = buf.data_ptr();
    size_t n = static_cast<size_t>(buf.numel());
    return issue(work, [&](dt_request **r) {
        return dt_iallreduce(comm_, p, p, n, red.dtype, red.op, r);
    });
}

// One all-reduce of the list's elements laid end to end.
c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::allreduce_coalesced(
    std::vector<at::Tensor> &tensors, const c10d::AllreduceCoalescedOptions &opts)
{
    check_uniform(tensors, "allreduce_coalesced", "the tensor list");
    Reduction red = reduction_of(tensors[0].scalar_type(), opts.reduceOp,
                                 "allreduce_coalesced");
    std::vector<at::Tensor> outs = tensors;
    at::Tensor flat = flatten(tensors);
    auto work = make_work(OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", outs, {flat},
                          [flat, outs]() mutable { unflatten(flat, outs); });
    void *p = flat.data_ptr();
    size_t n = static_cast<size_t>(flat.numel());
    return issue(work, [&](dt_request **r) {
        return dt_iallreduce(comm_, p, p, n, red.dtype, red.op, r);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::broadcast(std::vector<at::Tensor> &tensors,
                                                             const c10d::BroadcastOptions &opts)
{
    at::Tensor t = single(tensors, "broadcast");
    TORCH_CHECK(opts.rootTensor == 0, "dtrain broadcast: root tensor ", opts.rootTensor,
                " of a single tensor");
    check_root(opts.rootRank, getSize(), "broadcast");
    Carrier c = carrier_of(t.scalar_type());
    at::Tensor buf = contiguous_of(t);
    auto work = make_work(OpType::BROADCAST, "broadcast", {t}, {buf}, copy_back(t, buf));
    void *p = buf.data_ptr();
    size_t n = static_cast<size_t>(buf.numel()) * c.per_element;
    int root = static_cast<int>(opts.rootRank);
    return issue(work, [&](dt_request **r) {
        return dt_ibroadcast(comm_, p, p, n, c.dtype, root, r);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::reduce(std::vector<at::Tensor> &tensors,
                                                          const c10d::ReduceOptions &opts)
{
    at::Tensor t = single(tensors, "reduce");
    check_root(opts.rootRank, getSize(), "reduce");
    Reduction red = reduction_of(t.scalar_type(), opts.reduceOp, "reduce");
    int root = static_cast<int>(opts.rootRank);
    at::Tensor buf = contiguous_of(t);
    auto work = make_work(OpType::REDUCE, "reduce", {t}, {buf},
                          root == getRank() ? copy_back(t, buf) : nullptr);
    void *p = buf.data_ptr(), *out = root == getRank() ? p : nullptr;
    size_t n = static_cast<size_t>(buf.numel());
    return issue(work, [&](dt_request **r) {
        return dt_ireduce(comm_, p, out, n, red.dtype, red.op, root, r);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::allgather(
    std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::AllgatherOptions &)
{
    at::Tensor in = single(inputs, "allgather");
    TORCH_CHECK(outputs.size() == 1, "dtrain allgather: takes one output list, got ",
                outputs.size());
    std::vector<at::Tensor> outs = outputs[0];
    check_list(outs, in, static_cast<size_t>(getSize()), "allgather", "the output list");
    Carrier c = carrier_of(in.scalar_type());
    at::Tensor src = contiguous_of(in), flat = at::empty({getSize() * in.numel()}, in.options());
    auto work = make_work(OpType::ALLGATHER, "allgather", outs, {src, flat},
                          [flat, outs]() mutable { unflatten(flat, outs); });
    size_t n = static_cast<size_t>(in.numel()) * c.per_element;
    return issue(work, [&](dt_request **r) {
        return dt_iallgather(comm_, src.data_ptr(), flat.data_ptr(), n, c.dtype, r);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::_allgather_base(
    at::Tensor &output, at::Tensor &input, const c10d::AllgatherOptions &)
{
    check_tensor(input, "_allgather_base");
    check_tensor(output, "_allgather_base");
    check_same_dtype(input, output, "_allgather_base");
    TORCH_CHECK(output.numel() == input.numel() * getSize(), "dtrain _allgather_base: the "
                "output has ", output.numel(), " elements; the group's ", getSize(), " inputs "
                "of ", input.numel(), " need ", input.numel() * getSize());
    Carrier c = carrier_of(input.scalar_type());
    at::Tensor src = contiguous_of(input), dst = contiguous_of(output);
    auto work = make_work(OpType::_ALLGATHER_BASE, "_allgather_base", {output}, {src, dst},
                          copy_back(output, dst));
    size_t n = static_cast<size_t>(input.numel()) * c.per_element;
    return issue(work, [&](dt_request **r) {
        return dt_iallgather(comm_, src.data_ptr(), dst.data_ptr(), n, c.dtype, r);
    });
}

// One all-gather of the inputs laid end to end; rank r's piece of the
// result fills outputs[r].
c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::allgather_coalesced(
    std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::AllgatherOptions &)
{
    check_uniform(inputs, "allgather_coalesced", "the input list");
    TORCH_CHECK(outputs.size() == static_cast<size_t>(getSize()), "dtrain allgather_coalesced: ",
                outputs.size(), " output lists for a group of ", getSize(), " ranks");
    for (size_t r = 0; r < outputs.size(); r++) {
        const auto &list = outputs[r];
        TORCH_CHECK(list.size() == inputs.size(), "dtrain allgather_coalesced: output list ", r,
                    " holds ", list.size(), " tensors and the input list ", inputs.size());
        for (size_t i = 0; i < list.size(); i++) {
            check_tensor(list[i], "allgather_coalesced");
            TORCH_CHECK(list[i].scalar_type() == inputs[i].scalar_type() &&
                            list[i].numel() == inputs[i].numel(),
                        "dtrain allgather_coalesced: output ", i, " of list ", r, " holds ",
                        list[i].numel(), " ", list[i].scalar_type(), " elements where input ", i,
                        " holds ", inputs[i].numel(), " ", inputs[i].scalar_type());
        }
    }
    Carrier c = carrier_of(inputs[0].scalar_type());
    at::Tensor src = flatten(inputs), flat = at::empty({getSize() * src.numel()}, src.options());
    std::vector<at::Tensor> outs;
    for (const auto &list : outputs) outs.insert(outs.end(), list.begin(), list.end());
    auto work = make_work(OpType::ALLGATHER_COALESCED, "allgather_coalesced", outs, {src, flat},
                          [flat, outs]() mutable { unflatten(flat, outs); });
    size_t n = static_cast<size_t>(src.numel()) * c.per_element;
    return issue(work, [&](dt_request **r) {
        return dt_iallgather(comm_, src.data_ptr(), flat.data_ptr(), n, c.dtype, r);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::gather(
    std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::GatherOptions &opts)
{
    at::Tensor in = single(inputs, "gather");
    check_root(opts.rootRank, getSize(), "gather");
    int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> outs;
    at::Tensor flat;
    if (root == getRank()) {
        TORCH_CHECK(outputs.size() == 1, "dtrain gather: the root takes one output list, got ",
                    outputs.size());
        outs = outputs[0];
        check_list(outs, in, static_cast<size_t>(getSize()), "gather", "the output list");
        flat = at::empty({getSize() * in.numel()}, in.options());
    } else {
        TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                    "dtrain gather: only the root (rank ", root, ") takes output tensors");
    }
    Carrier c = carrier_of(in.scalar_type());
    at::Tensor src = contiguous_of(in);
    std::function<void()> then;
    if (flat.defined()) then = [flat, outs]() mutable { unflatten(flat, outs); };
    auto work = make_work(OpType::GATHER, "gather", outs, {src, flat}, then);
    void *dst = flat.defined() ? flat.data_ptr() : nullptr;
    size_t n = static_cast<size_t>(in.numel()) * c.per_element;
    return issue(work, [&](dt_request **r) {
        return dt_igather(comm_, src.data_ptr(), dst, n, c.dtype, root, r);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::scatter(
    std::vector<at::Tensor> &outputs, std::vector<std::vector<at::Tensor>> &inputs,
    const c10d::ScatterOptions &opts)
{
    at::Tensor out = single(outputs, "scatter");
    check_root(opts.rootRank, getSize(), "scatter");
    int root = static_cast<int>(opts.rootRank);
    at::Tensor flat;
    if (root == getRank()) {
        TORCH_CHECK(inputs.size() == 1, "dtrain scatter: the root takes one input list, got ",
                    inputs.size());
        check_list(inputs[0], out, static_cast<size_t>(getSize()), "scatter",
                   "the input list");
        flat = flatten(inputs[0]);
    } else {
        TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                    "dtrain scatter: only the root (rank ", root, ") takes input tensors");
    }
    Carrier c = carrier_of(out.scalar_type());
    at::Tensor dst = contiguous_of(out);
    auto work = make_work(OpType::SCATTER, "scatter", {out}, {dst, flat}, copy_back(out, dst));
    void *src = flat.defined() ? flat.data_ptr() : nullptr;
    size_t n = static_cast<size_t>(out.numel()) * c.per_element;
    return issue(work, [&](dt_request **r) {
        return dt_iscatter(comm_, src, dst.data_ptr(), n, c.dtype, root, r);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::reduce_scatter(
    std::vector<at::Tensor> &outputs, std::vector<std::vector<at::Tensor>> &inputs,
    const c10d::ReduceScatterOptions &opts)
{
    at::Tensor out = single(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1, "dtrain reduce_scatter: takes one input list, got ",
                inputs.size());
    check_list(inputs[0], out, static_cast<size_t>(getSize()), "reduce_scatter",
               "the input list");
    Reduction red = reduction_of(out.scalar_type(), opts.reduceOp, "reduce_scatter");
    at::Tensor flat = flatten(inputs[0]), dst = contiguous_of(out);
    auto work = make_work(OpType::REDUCE_SCATTER, "reduce_scatter", {out}, {flat, dst},
                          copy_back(out, dst));
    size_t n = static_cast<size_t>(out.numel());
    return issue(work, [&](dt_request **r) {
        return dt_ireduce_scatter(comm_, flat.data_ptr(), dst.data_ptr(), n, red.dtype, red.op,
                                  r);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::_reduce_scatter_base(
    at::Tensor &output, at::Tensor &input, const c10d::ReduceScatterOptions &opts)
{
    check_tensor(input, "_reduce_scatter_base");
    check_tensor(output, "_reduce_scatter_base");
    check_same_dtype(input, output, "_reduce_scatter_base");
    TORCH_CHECK(input.numel() == output.numel() * getSize(), "dtrain _reduce_scatter_base: "
                "the input has ", input.numel(), " elements; ", getSize(), " outputs of ",
                output.numel(), " need ", output.numel() * getSize());
    Reduction red = reduction_of(output.scalar_type(), opts.reduceOp, "_reduce_scatter_base");
    at::Tensor src = contiguous_of(input), dst = contiguous_of(output);
    auto work = make_work(OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", {output},
                          {src, dst}, copy_back(output, dst));
    size_t n = static_cast<size_t>(output.numel());
    return issue(work, [&](dt_request **r) {
        return dt_ireduce_scatter(comm_, src.data_ptr(), dst.data_ptr(), n, red.dtype, red.op,
                                  r);
    });
}

// An all-to-all-v of send's pieces into recv's: counts in the carrier's
// elements, the four arrays kept in the Work until dtrain is done.
c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::alltoallv(
    at::Tensor send, at::Tensor recv, c10::intrusive_ptr<WorkDtrain> work,
    std::vector<size_t> send_counts, std::vector<size_t> recv_counts)
{
    size_t p = static_cast<size_t>(getSize());
    Carrier c = carrier_of(send.scalar_type());
    std::vector<size_t> &a = work->counts;
    a.assign(4 * p, 0);
    for (size_t i = 0; i < p; i++) {
        a[i] = send_counts[i] * c.per_element;
        a[2 * p + i] = recv_counts[i] * c.per_element;
        if (i) a[p + i] = a[p + i - 1] + a[i - 1];
        if (i) a[3 * p + i] = a[3 * p + i - 1] + a[2 * p + i - 1];
    }
    const size_t *sc = a.data(), *sd = sc + p, *rc = sd + p, *rd = rc + p;
    return issue(work, [&](dt_request **r) {
        return dt_ialltoallv(comm_, send.data_ptr(), sc, sd, recv.data_ptr(), rc, rd, c.dtype,
                             r);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::alltoall_base(
    at::Tensor &output, at::Tensor &input, std::vector<int64_t> &output_splits,
    std::vector<int64_t> &input_splits, const c10d::AllToAllOptions &)
{
    check_tensor(input, "alltoall_base");
    check_tensor(output, "alltoall_base");
    check_same_dtype(input, output, "alltoall_base");
    at::Tensor src = contiguous_of(input), dst = contiguous_of(output);
    auto work = make_work(OpType::ALLTOALL_BASE, "alltoall_base", {output}, {src, dst},
                          copy_back(output, dst));
    std::vector<size_t> sc = split_counts(input_splits, input, getSize(), "input");
    std::vector<size_t> rc = split_counts(output_splits, output, getSize(), "output");
    if (!input_splits.empty() || !output_splits.empty())
        return alltoallv(src, dst, work, sc, rc);
    TORCH_CHECK(input.numel() == output.numel(), "dtrain alltoall_base: the output has ",
                output.numel(), " elements and the input ", input.numel(), "; without split "
                "sizes they must be equal");
    Carrier c = carrier_of(input.scalar_type());
    size_t n = sc.empty() ? 0 : sc[0] * c.per_element;
    return issue(work, [&](dt_request **r) {
        return dt_ialltoall(comm_, src.data_ptr(), dst.data_ptr(), n, c.dtype, r);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::alltoall(std::vector<at::Tensor> &outputs,
                                                            std::vector<at::Tensor> &inputs,
                                                            const c10d::AllToAllOptions &)
{
    size_t p = static_cast<size_t>(getSize());
    TORCH_CHECK(inputs.size() == p && outputs.size() == p, "dtrain alltoall: ", inputs.size(),
                " inputs and ", outputs.size(), " outputs for a group of ", p, " ranks");
    for (size_t i = 0; i < p; i++) {
        check_tensor(inputs[i], "alltoall");
        check_tensor(outputs[i], "alltoall");
        check_same_dtype(inputs[0], inputs[i], "alltoall");
        check_same_dtype(inputs[0], outputs[i], "alltoall");
    }
    std::vector<at::Tensor> outs = outputs;
    at::Tensor src = flatten(inputs), dst = flatten(outputs);
    auto work = make_work(OpType::ALLTOALL, "alltoall", outs, {src, dst},
                          [dst, outs]() mutable { unflatten(dst, outs); });
    return alltoallv(src, dst, work, numels(inputs), numels(outputs));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::barrier(const c10d::BarrierOptions &)
{
    auto work = make_work(OpType::BARRIER, "barrier", {}, {});
    return issue(work, [&](dt_request **r) { return dt_ibarrier(comm_, r); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::send(std::vector<at::Tensor> &tensors,
                                                        int dst, int tag)
{
    at::Tensor t = single(tensors, "send");
    Carrier c = carrier_of(t.scalar_type());
    at::Tensor src = contiguous_of(t);
    auto work = make_work(OpType::SEND, "send", {t}, {src});
    size_t n = static_cast<size_t>(t.numel()) * c.per_element;
    return issue(work, [&](dt_request **r) {
        return dt_isend_tag(comm_, src.data_ptr(), n, c.dtype, dst, tag, r);
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::recv(std::vector<at::Tensor> &tensors,
                                                        int src, int tag)
{
    at::Tensor t = single(tensors, "recv");
    Carrier c = carrier_of(t.scalar_type());
    at::Tensor buf = contiguous_of(t);
    auto work = make_work(OpType::RECV, "recv", {t}, {buf}, copy_back(t, buf), src);
    size_t n = static_cast<size_t>(t.numel()) * c.per_element;
    return issue(work, [&](dt_request **r) {
        return dt_irecv_tag(comm_, buf.data_ptr(), n, c.dtype, src, tag, r);
    });
}

// The next message of whichever rank's comes first with this tag; the
// Work's sourceRank() says whose, once it completed.
c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::recvAnysource(std::vector<at::Tensor> &tensors,
                                                                 int tag)
{
    at::Tensor t = single(tensors, "recvAnysource");
    Carrier c = carrier_of(t.scalar_type());
    at::Tensor buf = contiguous_of(t);
    auto work = make_work(OpType::RECVANYSOURCE, "recvAnySource", {t}, {buf}, copy_back(t, buf));
    size_t n = static_cast<size_t>(t.numel()) * c.per_element;
    return issue(work, [&](dt_request **r) {
        return dt_irecv_any(comm_, buf.data_ptr(), n, c.dtype, tag, &work->source_rank, r);
    });
}

c10::intrusive_ptr<ProcessGroupDtrain> create_process_group(
    const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
    std::chrono::milliseconds timeout)
{
    return c10::make_intrusive<ProcessGroupDtrain>(store, rank, size, timeout);
}

} // namespace dtrain_torch
