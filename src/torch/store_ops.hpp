// A c10d::Store (the process group's, as PyTorch hands it to the backend)
// as the key-value store dt_comm_init_external joins through.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

extern "C" {
#include "dtrain/comm.h"
}

namespace dtrain_torch {

// What the callbacks' ctx points to; it must outlive the communicator.
struct StoreRef {
    c10::intrusive_ptr<c10d::Store> store;
};

extern const dt_kv_ops store_ops;

} // namespace dtrain_torch
