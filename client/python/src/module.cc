// rackhub._core: the pybind11 binding of librackhub (client/include/rackhub/client/client.h).
//
// Python sees one class, Client, and one exception, RackhubError. Data calls
// (push_pull, init, pull) take objects with the buffer protocol (numpy arrays,
// `tensor.numpy()` of CPU tensors, memoryview, array.array('f')): C-contiguous
// float32 (format 'f'); the output of push_pull and pull must be writable.
// The binding keeps the buffer exports (Py_buffer views) next to the ticket
// and releases them only once the ticket completed (the library no longer
// touches the memory) or the client is closed, so a buffer can never be freed
// or resized while the I/O thread reads or writes it (zero-copy: fp32 keys
// are sent from and received into that memory directly).
//
// Threads: the library completes tickets on its own I/O thread. This binding
// registers no callbacks, so that thread never touches Python. Every blocking
// call (connect, declare_key, wait, close) releases the GIL; wait polls in
// slices so that Ctrl-C (KeyboardInterrupt) is delivered while waiting.
// A Client object may be used from several Python threads (the library is
// thread-safe; the table of held buffers has its own mutex).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "rackhub/client/client.h"
#include "rackhub/net/frame.h"

namespace py = pybind11;
namespace rc = rackhub::client;

namespace {

// The RackhubError type object and its subclasses RolledBack (code
// ROLLED_BACK) and WorkerLost (code SERVER, wire WORKER_LOST), created at
// import; they live as long as the module.
PyObject* g_error_type = nullptr;
PyObject* g_rolled_back_type = nullptr;
PyObject* g_worker_lost_type = nullptr;

[[noreturn]] void Raise(const rc::Error& e) {
  py::gil_scoped_acquire gil;
  PyObject* raw = g_error_type;
  if (e.code == rc::ErrorCode::kRolledBack) raw = g_rolled_back_type;
  if (e.code == rc::ErrorCode::kServer && e.wire == rc::WireError::kWorkerLost) {
    raw = g_worker_lost_type;
  }
  py::object type = py::reinterpret_borrow<py::object>(raw);
  py::object exc = type(py::str(e.message));
  exc.attr("code") = py::str(rc::ErrorCodeName(e.code));
  exc.attr("wire") = e.code == rc::ErrorCode::kServer || e.code == rc::ErrorCode::kUnauthenticated
                         ? py::object(py::str(rc::WireErrorName(e.wire)))
                         : py::object(py::none());
  exc.attr("iteration") = e.iteration;
  PyErr_SetObject(raw, exc.ptr());
  throw py::error_already_set();
}

rc::OptimizerSpec SpecFromDict(const py::dict& d) {
  rc::OptimizerSpec s;
  for (auto item : d) {
    const std::string k = py::str(item.first);
    const py::handle v = item.second;
    if (k == "type") s.type = py::str(v);
    else if (k == "lr" || k == "learning_rate") s.learning_rate = v.cast<double>();
    else if (k == "momentum") s.momentum = v.cast<double>();
    else if (k == "weight_decay") s.weight_decay = v.cast<double>();
    else if (k == "beta1") s.beta1 = v.cast<double>();
    else if (k == "beta2") s.beta2 = v.cast<double>();
    else if (k == "eps" || k == "epsilon") s.epsilon = v.cast<double>();
    else if (k == "initial_accumulator") s.initial_accumulator = v.cast<double>();
    else if (k == "reduction") {
      const std::string r = py::str(v);
      if (r != "mean" && r != "sum" && r != "min" && r != "max" && r != "product") {
        throw py::value_error("optimizer.reduction: mean, sum, min, max or product, got '" + r +
                              "'");
      }
      s.reduction = r;
    } else {
      throw py::value_error("optimizer." + k + ": unknown field (type, lr, momentum, weight_decay, "
                            "beta1, beta2, eps, initial_accumulator, reduction)");
    }
  }
  return s;
}

rc::DType DTypeFromString(const std::string& s) {
  if (s == "fp32" || s == "float32") return rc::DType::kFp32;
  if (s == "fp16" || s == "float16") return rc::DType::kFp16;
  if (s == "bf16" || s == "bfloat16") return rc::DType::kBf16;
  throw py::value_error("dtype: fp32, fp16 or bf16 (wire type), got '" + s + "'");
}

const char* DTypeName(rc::DType d) {
  switch (d) {
    case rc::DType::kFp32: return "fp32";
    case rc::DType::kFp16: return "fp16";
    case rc::DType::kBf16: return "bf16";
  }
  return "?";
}

// The buffer exports of one ticket's operands: held (with their Py_buffer
// views, so the exporter can neither free nor resize the memory) until the
// ticket completed. Created and destroyed with the GIL held.
struct Held {
  std::vector<std::unique_ptr<py::buffer_info>> views;

  std::span<const float> Read(const py::buffer& b, const char* what) {
    const py::buffer_info& i = View(b, false, what);
    return {static_cast<const float*>(i.ptr), static_cast<size_t>(i.size)};
  }
  std::span<float> Write(const py::buffer& b, const char* what) {
    const py::buffer_info& i = View(b, true, what);
    return {static_cast<float*>(i.ptr), static_cast<size_t>(i.size)};
  }
  // Row ids: a C-contiguous int64 or uint64 buffer (numpy, torch .numpy());
  // negative int64 ids are refused naming the first.
  std::span<const uint64_t> Ids(const py::buffer& b, const char* what) {
    const py::buffer_info& i = View(b, false, what, true);
    const auto* p = static_cast<const uint64_t*>(i.ptr);
    const bool is_signed = i.format == "q" || i.format == "l";
    for (py::ssize_t k = 0; is_signed && k < i.size; ++k) {
      if (static_cast<int64_t>(p[k]) < 0) {
        throw py::value_error(std::string(what) + "[" + std::to_string(k) + "] = " +
                              std::to_string(static_cast<int64_t>(p[k])) +
                              " is negative; row ids are >= 0");
      }
    }
    return {p, static_cast<size_t>(i.size)};
  }

 private:
  const py::buffer_info& View(const py::buffer& b, bool writable, const char* what,
                              bool ids = false) {
    auto info = std::make_unique<py::buffer_info>(b.request(writable));
    const bool ok = ids ? (info->itemsize == 8 && (info->format == "q" || info->format == "l" ||
                                                   info->format == "Q" || info->format == "L"))
                        : (info->format == py::format_descriptor<float>::format() &&
                           info->itemsize == 4);
    if (!ok) {
      throw py::type_error(std::string(what) +
                           (ids ? ": an int64 or uint64 buffer of row ids is needed"
                                : ": a float32 buffer is needed (format 'f')") +
                           ", got format '" + info->format + "' of item size " +
                           std::to_string(info->itemsize));
    }
    py::ssize_t expect = info->itemsize;
    for (py::ssize_t d = info->ndim - 1; d >= 0; --d) {
      if (info->shape[d] != 1 && info->strides[d] != expect) {
        throw py::value_error(std::string(what) + ": the buffer is not C-contiguous "
                              "(make it contiguous first)");
      }
      expect *= info->shape[d];
    }
    views.push_back(std::move(info));
    return *views.back();
  }
};

// The user's words for a transport (rackhub.torch.init's `transport`).
void SetTransport(const std::string& t, rc::Options* o) {
  if (t == "auto") {  // shared memory if the hub is on this host, else RDMA if any, else TCP
    o->transport = rc::Transport::kAuto;
    o->shm = rc::Shm::kAuto;
  } else if (t == "tcp") {
    o->transport = rc::Transport::kTcp;
    o->shm = rc::Shm::kOff;
  } else if (t == "shm") {
    o->transport = rc::Transport::kTcp;
    o->shm = rc::Shm::kOn;
  } else if (t == "rdma") {
    o->transport = rc::Transport::kRdma;
    o->shm = rc::Shm::kOff;
  } else {
    throw py::value_error("transport: auto, tcp, shm or rdma, got '" + t + "'");
  }
}

class PyClient {
 public:
  PyClient(const std::string& hub, const std::string& tenant, const std::string& token,
           uint32_t rank, uint32_t rack, double connect_timeout_s, double op_timeout_s,
           bool reconnect, const std::string& transport, const std::string& rdma_hub,
           const std::string& rdma_device, bool busy_poll) {
    rc::Options o;
    o.hub = hub;
    o.tenant = tenant;
    o.token = token;
    o.rank = rank;
    o.rack = rack;
    o.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(connect_timeout_s * 1000));
    o.op_timeout = std::chrono::milliseconds(static_cast<int64_t>(op_timeout_s * 1000));
    o.reconnect = reconnect;
    SetTransport(transport, &o);
    o.rdma_hub = rdma_hub;
    o.rdma_device = rdma_device;
    o.rdma_busy_poll = busy_poll;
    o.shm_busy_poll = busy_poll;
    rc::Error err;
    {
      py::gil_scoped_release nogil;
      client_ = rc::Client::Connect(o, &err);
    }
    if (!client_) Raise(err);
  }

  ~PyClient() { Close(); }

  void Close() {
    if (!client_) return;
    {
      py::gil_scoped_release nogil;
      client_->Close();  // pending tickets fail; the I/O thread stops touching buffers
    }
    std::unordered_map<rc::Ticket, std::unique_ptr<Held>> drop;
    {
      std::lock_guard lock(mu_);
      drop.swap(held_);
    }
    drop.clear();  // releases the buffer views, with the GIL held
  }

  rc::Client& c() {
    if (!client_) {
      rc::Error e;
      e.code = rc::ErrorCode::kClosed;
      e.message = "the client is closed";
      Raise(e);
    }
    return *client_;
  }

  uint32_t DeclareKey(const std::string& name, uint64_t elements, const std::string& dtype,
                      std::optional<py::dict> optimizer, bool init_from_client, double topk_ratio,
                      bool error_feedback, std::vector<uint32_t> participants) {
    rc::KeyDecl d;
    d.name = name;
    d.elements = elements;
    d.dtype = DTypeFromString(dtype);
    if (optimizer) d.optimizer = SpecFromDict(*optimizer);
    d.init = init_from_client ? rc::Init::kFromClient : rc::Init::kZeros;
    if (!(topk_ratio >= 0.0 && topk_ratio <= 1.0)) {  // NaN too
      throw py::value_error("topk_ratio: in (0, 1], or 0 for dense pushes, got " +
                            std::to_string(topk_ratio));
    }
    d.topk_ratio = topk_ratio;
    d.error_feedback = error_feedback;
    d.participants = std::move(participants);
    return Declare(d);
  }

  py::object KeyInfo(uint32_t key) {
    auto info = c().GetKeyInfo(key);
    if (!info) return py::none();
    py::dict d;
    d["id"] = info->id;
    d["name"] = info->name;
    d["elements"] = info->elements;
    d["dtype"] = DTypeName(info->dtype);
    d["init"] = info->init == rc::Init::kFromClient ? "client"
                : info->init == rc::Init::kRandom   ? "random"
                                                    : "zeros";
    d["rows"] = info->rows;
    d["dim"] = info->dim;
    d["first_chunk"] = info->first_chunk;
    d["chunk_count"] = info->chunk_count;
    d["version"] = info->version;
    d["next_iteration"] = info->next_iteration;
    d["resync_needed"] = info->resync_needed;
    d["topk_ratio"] = info->topk_ratio;
    d["participants"] = info->participants;
    d["updates"] = info->updates;
    d["slowest_iteration"] = info->slowest_iteration;
    d["membership_generation"] = info->membership_generation;
    d["members"] = info->members;
    d["membership_mixed"] = info->membership_mixed;
    return d;
  }

  std::optional<uint32_t> FindKey(const std::string& name) { return c().FindKey(name); }

  rc::Ticket PushPull(uint32_t key, const py::buffer& grad, const py::buffer& out) {
    rc::Client& cl = c();
    auto held = std::make_unique<Held>();
    const std::span<const float> g = held->Read(grad, "grad");
    const std::span<float> o = held->Write(out, "out");
    return Issue(std::move(held), [&] { return cl.PushPull(key, g, o); });
  }

  rc::Ticket Init(uint32_t key, const py::buffer& values) {
    rc::Client& cl = c();
    auto held = std::make_unique<Held>();
    const std::span<const float> v = held->Read(values, "values");
    return Issue(std::move(held), [&] { return cl.Init(key, v); });
  }

  rc::Ticket Pull(uint32_t key, const py::buffer& out) {
    rc::Client& cl = c();
    auto held = std::make_unique<Held>();
    const std::span<float> o = held->Write(out, "out");
    return Issue(std::move(held), [&] { return cl.Pull(key, o); });
  }

  rc::Ticket PushPullRows(uint32_t key, const py::buffer& ids, const py::buffer& grads,
                          const py::buffer& want, const py::buffer& out) {
    rc::Client& cl = c();
    auto held = std::make_unique<Held>();
    const auto i = held->Ids(ids, "ids");
    const auto g = held->Read(grads, "grads");
    const auto w = held->Ids(want, "want");
    const auto o = held->Write(out, "out");
    return Issue(std::move(held), [&] { return cl.PushPullRows(key, i, g, w, o); });
  }

  rc::Ticket PullRows(uint32_t key, const py::buffer& ids, const py::buffer& out) {
    rc::Client& cl = c();
    auto held = std::make_unique<Held>();
    const auto i = held->Ids(ids, "ids");
    const auto o = held->Write(out, "out");
    return Issue(std::move(held), [&] { return cl.PullRows(key, i, o); });
  }

  uint32_t DeclareTable(const std::string& name, uint64_t rows, uint32_t dim,
                        const std::string& dtype, std::optional<py::dict> optimizer,
                        const std::string& init, float init_scale, uint64_t seed) {
    rc::KeyDecl d;
    d.name = name;
    d.rows = rows;
    d.dim = dim;
    d.dtype = DTypeFromString(dtype);
    if (optimizer) d.optimizer = SpecFromDict(*optimizer);
    if (init == "zeros") {
      d.init = rc::Init::kZeros;
    } else if (init == "random") {
      d.init = rc::Init::kRandom;
    } else {
      throw py::value_error("init: 'zeros' or 'random', got '" + init + "'");
    }
    d.init_scale = init_scale;
    d.init_seed = seed;
    return Declare(d);
  }

  rc::Ticket SetOptimizer(uint32_t key, const py::dict& spec, uint64_t from_iteration) {
    return c().SetOptimizer(key, SpecFromDict(spec), from_iteration);
  }
  rc::Ticket CommitElastic(uint64_t commit) { return c().CommitElastic(commit); }
  rc::Ticket RollbackElastic(uint64_t commit) { return c().RollbackElastic(commit); }

  // Waits for the ticket (GIL released, in slices so signals get through).
  // Raises RackhubError on failure; the held buffers are released either way.
  void Wait(rc::Ticket t, std::optional<double> timeout_s) {
    rc::Client& cl = c();
    const auto slice = std::chrono::milliseconds(200);
    const auto deadline =
        timeout_s ? std::optional(std::chrono::steady_clock::now() +
                                  std::chrono::milliseconds(static_cast<int64_t>(*timeout_s * 1000)))
                  : std::nullopt;
    const std::string pending_prefix = "ticket " + std::to_string(t) + " not done after";
    rc::Error err;
    for (;;) {
      auto wait = slice;
      if (deadline) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            *deadline - std::chrono::steady_clock::now());
        wait = std::max(std::chrono::milliseconds(0), std::min(wait, left));
      }
      {
        py::gil_scoped_release nogil;
        err = cl.WaitFor(t, wait);
      }
      // WaitFor's own timeout leaves the ticket pending ("ticket T not done
      // after ..."); a ticket that failed through Options::op_timeout is
      // consumed and also reports kTimeout, with another message.
      const bool still_pending = err.code == rc::ErrorCode::kTimeout &&
                                 err.message.rfind(pending_prefix, 0) == 0;
      if (!still_pending) break;
      if (deadline && std::chrono::steady_clock::now() >= *deadline) {
        err.message = "wait: ticket " + std::to_string(t) + " not done within " +
                      std::to_string(*timeout_s) + " s";
        Raise(err);  // still pending: keep holding its buffers
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    Release(t);
    if (!err.ok()) Raise(err);
  }

  void Release(rc::Ticket t) {
    std::unique_ptr<Held> drop;  // released after the lock, with the GIL held
    std::lock_guard lock(mu_);
    auto it = held_.find(t);
    if (it != held_.end()) {
      drop = std::move(it->second);
      held_.erase(it);
    }
  }

  size_t Pending() {
    std::lock_guard lock(mu_);
    return held_.size();
  }

 private:
  // Declares the key `d` (GIL released); raises RackhubError on failure.
  uint32_t Declare(const rc::KeyDecl& d) {
    rc::KeyId id = 0;
    rc::Error err;
    rc::Client& cl = c();
    {
      py::gil_scoped_release nogil;
      err = cl.DeclareKey(d, &id);
    }
    if (!err.ok()) Raise(err);
    return id;
  }

  // Issues a ticket (`issue()`) and keeps its buffer exports `held` until it
  // completes. mu_ is held around both, so the buffers are held before anyone
  // can Wait the ticket.
  template <typename IssueTicket>
  rc::Ticket Issue(std::unique_ptr<Held> held, IssueTicket issue) {
    std::lock_guard lock(mu_);
    const rc::Ticket t = issue();
    held_.emplace(t, std::move(held));
    return t;
  }

  std::unique_ptr<rc::Client> client_;
  std::mutex mu_;
  std::unordered_map<rc::Ticket, std::unique_ptr<Held>> held_;  // GUARDED_BY(mu_)
};

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "rackhub data-plane client (librackhub) - see rackhub/__init__.py";
  py::class_<rc::LeasedBuffer>(m, "Lease", py::buffer_protocol(),
                               "Leased memory (Client.lease): float32, writable")
      .def_buffer([](rc::LeasedBuffer& b) {
        const std::span<float> f = b.floats();
        return py::buffer_info(f.data(), sizeof(float), py::format_descriptor<float>::format(),
                               1, {static_cast<py::ssize_t>(f.size())},
                               {static_cast<py::ssize_t>(sizeof(float))});
      })
      .def("__len__", [](rc::LeasedBuffer& b) { return b.floats().size(); });

  py::object base = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  g_error_type = PyErr_NewExceptionWithDoc(
      "rackhub._core.RackhubError",
      "A rackhub operation failed. Attributes: code (library error code name, e.g. "
      "'connection_lost', 'server', 'timeout'), wire (the hub's error code name for "
      "code == 'server', e.g. 'WORKER_LOST', else None).",
      base.ptr(), nullptr);
  m.attr("RackhubError") = py::handle(g_error_type);
  g_rolled_back_type = PyErr_NewExceptionWithDoc(
      "rackhub._core.RolledBack",
      "The hub's version of the key differs from the client's (a restarted hub reloaded an "
      "older checkpoint, or the key needs a pull after WORKER_LOST / BAD_ITERATION). "
      "Attribute iteration: the hub's version. Pull the key, then continue with the next batch.",
      g_error_type, nullptr);
  m.attr("RolledBack") = py::handle(g_rolled_back_type);
  g_worker_lost_type = PyErr_NewExceptionWithDoc(
      "rackhub._core.WorkerLost",
      "The hub refused a push with WORKER_LOST: another rank of the tenant died. Pull the key, "
      "back off and retry until the lost rank (or its replacement) is back.",
      g_error_type, nullptr);
  m.attr("WorkerLost") = py::handle(g_worker_lost_type);
  // What a WorkerLost's text opens with when a ROLLBACK of the tenant
  // failed the push (docs/elastic.md, "Hub optimizers").
  m.attr("ROLLBACK_REFUSAL") = py::str(rackhub::net::kRollbackRefusal);

  m.def(
      "table_init",
      [](uint64_t first_row, uint64_t rows, uint32_t dim, uint64_t seed, float scale,
         const py::buffer& out) {
        Held held;
        const std::span<float> o = held.Write(out, "out");
        if (o.size() != rows * dim) {
          throw py::value_error("out: " + std::to_string(o.size()) + " floats, rows x dim = " +
                                std::to_string(rows * dim));
        }
        rc::TableInitValues(seed, scale, first_row, rows, dim, o.data());
      },
      py::arg("first_row"), py::arg("rows"), py::arg("dim"), py::arg("seed"), py::arg("scale"),
      py::arg("out"),
      "Fills `out` (float32, rows * dim) with the initial values the hub gives rows "
      "[first_row, first_row + rows) of a table declared with init='random', bit for bit.");

  py::class_<PyClient>(m, "Client")
      .def(py::init<const std::string&, const std::string&, const std::string&, uint32_t,
                    uint32_t, double, double, bool, const std::string&, const std::string&,
                    const std::string&, bool>(),
           py::arg("hub"), py::arg("tenant"), py::arg("token"), py::arg("rank"),
           py::arg("rack") = 0, py::arg("connect_timeout") = 10.0,
           py::arg("op_timeout") = 120.0, py::arg("reconnect") = true,
           py::arg("transport") = "auto", py::arg("rdma_hub") = "",
           py::arg("rdma_device") = "", py::arg("busy_poll") = false,
           "Connects every lane of the hub (blocking, GIL released). transport: 'auto' (shared "
           "memory when the hub is on this host, else RDMA when a device reaches it, else TCP), "
           "'tcp', 'shm' (required) or 'rdma' (required).")
      .def_property_readonly("lanes", [](PyClient& s) { return s.c().lanes(); })
      .def_property_readonly("workers", [](PyClient& s) { return s.c().workers(); })
      .def_property_readonly("chunk_elements", [](PyClient& s) { return s.c().chunk_elements(); })
      .def_property_readonly("tenant_handle", [](PyClient& s) { return s.c().tenant_handle(); })
      .def_property_readonly("reconnects", [](PyClient& s) { return s.c().reconnects(); })
      .def_property_readonly("transport", [](PyClient& s) { return std::string(s.c().transport()); })
      .def_property_readonly("straggler_timeout_ms",
                             [](PyClient& s) { return s.c().straggler_timeout_ms(); })
      .def("declare_key", &PyClient::DeclareKey, py::arg("name"), py::arg("elements"),
           py::arg("dtype") = "fp32", py::arg("optimizer") = py::none(),
           py::arg("init_from_client") = false, py::arg("topk_ratio") = 0.0,
           py::arg("error_feedback") = true, py::arg("participants") = std::vector<uint32_t>{},
           "Declares (or finds) a dense key; returns its id. topk_ratio in (0, 1]: each chunk's "
           "push carries its ceil(ratio * elements) largest-magnitude entries; with "
           "error_feedback the rest is kept on this worker and added to the next push "
           "(docs/compression.md). 0 = dense. participants: the ranks (ascending) whose pushes "
           "each update sums; empty = every worker (docs/client.md, Participant sets).")
      .def("find_key", &PyClient::FindKey, py::arg("name"))
      .def("key_info", &PyClient::KeyInfo, py::arg("key"),
           "A dict of the key's fields, or None for an unknown id. topk_ratio: 0 for dense "
           "pushes; updates, slowest_iteration: bounded/async tenants, as the last "
           "push_pull/pull reported (0 in sync tenants); membership_generation, members, "
           "membership_mixed: elastic tenants (docs/elastic.md), the membership of the update "
           "that produced the values the last successful push_pull/pull returned (0 before "
           "and in other tenants).")
      .def("push_pull", &PyClient::PushPull, py::arg("key"), py::arg("grad"), py::arg("out"),
           "Starts a PushPull: sends `grad`, receives the reply into `out` (C-contiguous float32 "
           "buffers of the key's size, `out` writable); returns a ticket. Both are held until "
           "the ticket completes.")
      .def("init", &PyClient::Init, py::arg("key"), py::arg("values"))
      .def("pull", &PyClient::Pull, py::arg("key"), py::arg("out"))
      .def("declare_table", &PyClient::DeclareTable, py::arg("name"), py::arg("rows"),
           py::arg("dim"), py::arg("dtype") = "fp32", py::arg("optimizer") = py::none(),
           py::arg("init") = "zeros", py::arg("init_scale") = 0.0f, py::arg("seed") = 0,
           "Declares (or finds) a row-sparse table of rows x dim; init 'zeros' or 'random' "
           "(uniform in [-init_scale, init_scale), seeded). Returns its key id.")
      .def("push_pull_rows", &PyClient::PushPullRows, py::arg("key"), py::arg("ids"),
           py::arg("grads"), py::arg("want"), py::arg("out"),
           "Contributes rows `ids` (int64/uint64 buffer, duplicates summed) with `grads` "
           "(float32, len(ids) * dim) to the table's next iteration; `out` (float32, "
           "len(want) * dim) receives the rows `want` after the update. Returns a ticket.")
      .def("pull_rows", &PyClient::PullRows, py::arg("key"), py::arg("ids"), py::arg("out"),
           "The current rows `ids` into `out` (float32, len(ids) * dim). Returns a ticket.")
      .def("set_optimizer", &PyClient::SetOptimizer, py::arg("key"), py::arg("spec"),
           py::arg("from_iteration"))
      .def("commit_elastic", &PyClient::CommitElastic, py::arg("commit"),
           "Elastic tenants with hub optimizers: the hub copies every chunk at the members' "
           "commit `commit` (on every lane). Returns a ticket.")
      .def("rollback_elastic", &PyClient::RollbackElastic, py::arg("commit"),
           "Every chunk with a hub optimizer back to commit `commit`; Pull the keys after it. "
           "Returns a ticket.")
      .def("wait", &PyClient::Wait, py::arg("ticket"), py::arg("timeout") = py::none(),
           "Blocks (GIL released) until the ticket completes; raises RackhubError on failure.")
      .def(
          "lease",
          [](PyClient& s, uint32_t key) {
            rc::LeasedBuffer b;
            if (const rc::Error e = s.c().Lease(key, &b); !e.ok()) Raise(e);
            return b;
          },
          py::arg("key"),
          "Memory of the key's size (float32, zero-filled, buffer protocol: "
          "numpy.asarray(lease)) that the hubs on this host read in place: a push_pull whose "
          "grad is in it is not copied into the shared-memory ring (docs/client.md, Zero-copy "
          "pushes). Keep it alive and unchanged until that push_pull completed.")
      .def("pending", &PyClient::Pending, "Tickets issued and not yet waited.")
      .def("close", &PyClient::Close);
}
