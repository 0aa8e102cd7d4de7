// dtrain_torch._C: the ProcessGroupDtrain class for Python. The package's
// __init__.py registers it with torch.distributed as the "dtrain" backend.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>
#include <ATen/ATen.h>

#include <dtrain/comm.h>

#include "process_group.hpp"

namespace py = pybind11;

namespace {

// bytes of communication memory (dt_comm_mem_alloc) as a uint8 tensor that
// frees it when the last view goes; __init__.py's empty() views it typed.
at::Tensor comm_mem_bytes(int64_t bytes)
{
    TORCH_CHECK(bytes >= 0, "dtrain_torch.empty: ", bytes, " bytes");
    void *p = dt_comm_mem_alloc(static_cast<size_t>(bytes));
    if (!p) throw std::bad_alloc();
    return at::from_blob(p, {bytes}, [](void *q) { dt_comm_mem_free(q); },
                         at::TensorOptions().dtype(at::kByte));
}

} // namespace

PYBIND11_MODULE(_C, m)
{
    m.doc() = "dtrain's communicator as a torch.distributed process group";
    // ProcessGroup's Python type, which ours derives from.
    py::module::import("torch.distributed");
    py::class_<dtrain_torch::ProcessGroupDtrain,
               c10::intrusive_ptr<dtrain_torch::ProcessGroupDtrain>, c10d::ProcessGroup>(
        m, "ProcessGroupDtrain")
        .def(py::init(&dtrain_torch::create_process_group), py::arg("store"), py::arg("rank"),
             py::arg("size"), py::arg("timeout"),
             // Joining waits on the store, which a Python store would
             // need the interpreter for.
             py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("transport", &dtrain_torch::ProcessGroupDtrain::transport,
                               "what carries the group's messages: shm, tcp, shm+tcp or self");
    m.def("comm_mem_bytes", &comm_mem_bytes, py::arg("bytes"),
          "bytes of dtrain's communication memory as a uint8 tensor (see empty)");
}
