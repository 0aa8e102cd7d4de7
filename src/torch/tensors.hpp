// Torch tensors as dtrain buffers: which dt_dtype carries a tensor's
// elements, which (dt_dtype, dt_op) computes a torch reduction, and the
// checks every collective makes of its tensors. Each refusal is an
// exception whose message names the collective, the tensor's dtype or
// the op, and what would work.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstddef>
#include <vector>

extern "C" {
#include "dtrain/comm.h"
}

namespace dtrain_torch {

// How a tensor's elements travel: count elements of dtype for each torch
// element. A dtype dtrain lacks (int8, int16, bool, complex) travels as
// its bytes, for every collective that only moves data.
struct Carrier {
    dt_dtype dtype;
    size_t per_element;
};
Carrier carrier_of(at::ScalarType t);

// How a reduction runs, or an exception naming what dtrain cannot do.
struct Reduction {
    dt_dtype dtype;
    dt_op op;
};
Reduction reduction_of(at::ScalarType t, const c10d::ReduceOp &op, const char *collective);

// One dense CPU tensor, as every collective takes.
void check_tensor(const at::Tensor &t, const char *collective);
// The single tensor of a call (dtrain runs one per process), checked.
at::Tensor &single(std::vector<at::Tensor> &ts, const char *collective);
// A list of one or more tensors, all of one dtype.
void check_uniform(const std::vector<at::Tensor> &ts, const char *collective, const char *what);
// Every tensor of a list has t's dtype and numel, and there are n of them.
void check_list(const std::vector<at::Tensor> &ts, const at::Tensor &like, size_t n,
                const char *collective, const char *what);

// The elements of ts one after another, in one contiguous tensor.
at::Tensor flatten(const std::vector<at::Tensor> &ts);
// Copies consecutive pieces of flat back into ts.
void unflatten(const at::Tensor &flat, std::vector<at::Tensor> &ts);

// A contiguous tensor with t's contents: t itself when it is contiguous.
at::Tensor contiguous_of(const at::Tensor &t);

} // namespace dtrain_torch
