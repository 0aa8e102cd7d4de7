// Torch tensors as dtrain buffers (tensors.hpp).
#include "tensors.hpp"

#include <c10/util/Exception.h>

#include <string>

namespace dtrain_torch {

namespace {

std::string torch_name(at::ScalarType t)
{
    switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kByte: return "torch.uint8";
    case at::kChar: return "torch.int8";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    default: return std::string("torch.") + c10::toString(t);
    }
}

// The dt_dtype with t's very elements, or -1.
int native_of(at::ScalarType t)
{
    switch (t) {
    case at::kFloat: return DT_F32;
    case at::kDouble: return DT_F64;
    case at::kHalf: return DT_F16;
    case at::kBFloat16: return DT_BF16;
    case at::kByte: return DT_U8;
    case at::kInt: return DT_I32;
    case at::kLong: return DT_I64;
    default: return -1;
    }
}

const char *op_name(c10d::ReduceOp::RedOpType op)
{
    switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "an unknown op";
    }
}

dt_op dt_op_of(const c10d::ReduceOp &op, at::ScalarType t, const char *collective)
{
    switch (op.op_) {
    case c10d::ReduceOp::SUM: return DT_SUM;
    case c10d::ReduceOp::AVG: return DT_AVG;
    case c10d::ReduceOp::PRODUCT: return DT_PROD;
    case c10d::ReduceOp::MIN: return DT_MIN;
    case c10d::ReduceOp::MAX: return DT_MAX;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR: {
        TORCH_CHECK(!at::isFloatingType(t), "dtrain ", collective, ": ReduceOp.",
                    op_name(op.op_), " on ", torch_name(t), " is not supported: the bitwise "
                    "ops take integer and bool tensors");
        return op.op_ == c10d::ReduceOp::BAND ? DT_BAND
               : op.op_ == c10d::ReduceOp::BOR ? DT_BOR
                                               : DT_BXOR;
    }
    default: break;
    }
    TORCH_CHECK(false, "dtrain ", collective, ": ReduceOp.", op_name(op.op_), " on ",
                torch_name(t), " is not supported: dtrain reduces with SUM, PRODUCT, MIN, MAX, "
                "AVG and, on integers, BAND, BOR and BXOR");
}

} // namespace

Carrier carrier_of(at::ScalarType t)
{
    int native = native_of(t);
    if (native >= 0) return {static_cast<dt_dtype>(native), 1};
    return {DT_U8, c10::elementSize(t)};
}

// int8 sums and products wrap modulo 256 in two's complement whatever the
// signedness, so dtrain's uint8 gives their bits, as it gives the bitwise
// ops'; its comparisons would not. A bool's SUM and MAX are a logical or,
// PRODUCT and MIN an and: on 0 and 1, uint8's MAX and MIN; its bitwise ops
// uint8's.
Reduction reduction_of(at::ScalarType t, const c10d::ReduceOp &op, const char *collective)
{
    dt_op dop = dt_op_of(op, t, collective);
    int native = native_of(t);
    if (native >= 0) return {static_cast<dt_dtype>(native), dop};
    const int bitwise = dop == DT_BAND || dop == DT_BOR || dop == DT_BXOR;
    if (t == at::kChar && (dop == DT_SUM || dop == DT_PROD || bitwise)) return {DT_U8, dop};
    if (t == at::kBool && bitwise) return {DT_U8, dop};
    if (t == at::kBool && (dop == DT_SUM || dop == DT_MAX)) return {DT_U8, DT_MAX};
    if (t == at::kBool && (dop == DT_PROD || dop == DT_MIN)) return {DT_U8, DT_MIN};
    TORCH_CHECK(t != at::kChar, "dtrain ", collective, ": ReduceOp.", op_name(op.op_),
                " on torch.int8 is not supported: dtrain has no signed 8-bit type, and uint8 "
                "would order negative values wrongly (SUM, PRODUCT and the bitwise ops "
                "work; or use torch.int32)");
    TORCH_CHECK(t != at::kBool, "dtrain ", collective, ": ReduceOp.", op_name(op.op_),
                " on torch.bool is not supported (SUM, PRODUCT, MIN, MAX and the bitwise ops "
                "are)");
    TORCH_CHECK(false, "dtrain ", collective, ": cannot reduce ", torch_name(t),
                " tensors: dtrain reduces torch.float32, float64, float16, bfloat16, int32, "
                "int64 and uint8 (and int8 and bool with some ops); collectives that only move "
                "data take every dtype");
}

void check_tensor(const at::Tensor &t, const char *collective)
{
    TORCH_CHECK(t.defined(), "dtrain ", collective, ": a tensor is undefined");
    TORCH_CHECK(t.device().is_cpu(), "dtrain ", collective, ": the tensor is on ", t.device(),
                "; dtrain's backend takes CPU tensors (move it with .cpu())");
    TORCH_CHECK(t.layout() == at::kStrided, "dtrain ", collective,
                ": sparse tensors are not supported (use a dense tensor)");
}

at::Tensor &single(std::vector<at::Tensor> &ts, const char *collective)
{
    TORCH_CHECK(ts.size() == 1, "dtrain ", collective, ": takes one tensor per process, got ",
                ts.size());
    check_tensor(ts[0], collective);
    return ts[0];
}

void check_uniform(const std::vector<at::Tensor> &ts, const char *collective, const char *what)
{
    TORCH_CHECK(!ts.empty(), "dtrain ", collective, ": ", what, " is empty");
    for (size_t i = 0; i < ts.size(); i++) {
        check_tensor(ts[i], collective);
        TORCH_CHECK(ts[i].scalar_type() == ts[0].scalar_type(), "dtrain ", collective, ": ",
                    what, "[", i, "] is ", torch_name(ts[i].scalar_type()), " and ", what,
                    "[0] ", torch_name(ts[0].scalar_type()), "; they must match (one call "
                    "per dtype)");
    }
}

void check_list(const std::vector<at::Tensor> &ts, const at::Tensor &like, size_t n,
                const char *collective, const char *what)
{
    TORCH_CHECK(ts.size() == n, "dtrain ", collective, ": ", what, " holds ", ts.size(),
                " tensors where the group has ", n, " ranks");
    for (size_t i = 0; i < ts.size(); i++) {
        check_tensor(ts[i], collective);
        TORCH_CHECK(ts[i].scalar_type() == like.scalar_type(), "dtrain ", collective, ": ",
                    what, "[", i, "] is ", torch_name(ts[i].scalar_type()), ", not ",
                    torch_name(like.scalar_type()));
        TORCH_CHECK(ts[i].numel() == like.numel(), "dtrain ", collective, ": ", what, "[", i,
                    "] has ", ts[i].numel(), " elements, not ", like.numel());
    }
}

at::Tensor flatten(const std::vector<at::Tensor> &ts)
{
    std::vector<at::Tensor> flat;
    flat.reserve(ts.size());
    for (const auto &t : ts) flat.push_back(t.reshape({-1}));
    return at::cat(flat);
}

void unflatten(const at::Tensor &flat, std::vector<at::Tensor> &ts)
{
    int64_t off = 0;
    for (auto &t : ts) {
        t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
        off += t.numel();
    }
}

at::Tensor contiguous_of(const at::Tensor &t) { return t.is_contiguous() ? t : t.contiguous(); }

} // namespace dtrain_torch
