// The torch backend's compiled collectives: a c10d Backend that torch's ProcessGroup dispatches all_reduce,
// all_gather_into_tensor and reduce_scatter_tensor to with no Python on the way (DDP's reducer calls
// allreduce and getFuture from the autograd thread once per bucket; FSDP2 all-gathers and reduce-scatters
// each parameter group every step).
//
// A call on dense CUDA tensors whose launch hpccl has already snapshotted (same collective, buffers, size,
// dtype, op and stream) is replayed here: the same driver calls as CudaComm.fire (hpccl/gpu/cuda_comm.py), on the same
// FastState (calls counted and published, stream order kept through the tail event, snapshots dropped
// together through the generation). A group that spans nodes (one rank per node) replays its recorded
// network call instead: the network front door's entry (hpccl/csrc/_netdoor.c nd_fire_slot) is called
// directly under the GIL, with none of the Python backend's code on the way. Everything else, and every first
// call, goes to the Python backend (hpccl/torch/process_group.py), which validates, runs the call and arms the
// snapshot or the door's entry here.
// Built on first use by hpccl/torch/native.py; only c10 and c10d are used (no CUDA headers or libraries:
// the driver's entry points come from hpccl's own driver bindings).
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace py = pybind11;

namespace {

using launch_t = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                         void**, void**);
using capturing_t = int (*)(void*, int*);
using record_t = int (*)(void*, void*);
using wait_t = int (*)(void*, void*, unsigned);
using net_fire_t = int (*)(void*, int, unsigned long long, unsigned long long);  // door, slot, generation, stream
using count_t = int (*)(void*, void*, int);  // _netdoor.c nd_count: communicator, collective's name, commit
// hpccl/csrc/_hotpath.c hp_gpu_program: cuLaunchKernel, cuStreamIsCapturing, cuEventRecord, cuStreamBatchMemOp,
// steps, count, stream, tail event, steps done -> CUresult of the failing step, -1 capturing, 0
using program_t = int (*)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t*);

// hpccl.kernels.FastState, field for field
struct FastState {
  int64_t seq;
  uint64_t last_stream;
  int64_t gen;
  int32_t tail_live, live, held, pad;
};
constexpr uint64_t kNoStream = ~0ull;

// Drop a Python reference from C++ (any thread): under the GIL, or leaked while the interpreter is
// going away (taking the GIL then is not possible).
void drop_ref(py::object& obj) {
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  if (!Py_IsInitialized() || finalizing) {
    obj.release();
    return;
  }
  py::gil_scoped_acquire gil;
  obj = py::object();
}

enum Coll : int32_t { kAllReduce = 0, kAllGather = 1, kReduceScatter = 2 };

struct Key {
  uint64_t in, out, nbytes, stream;
  int32_t dtype, op;  // op: the collective in the high byte, torch's RedOpType in the low ones
  bool operator==(const Key& o) const {
    return in == o.in && out == o.out && nbytes == o.nbytes && stream == o.stream && dtype == o.dtype && op == o.op;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    uint64_t h = k.in * 0x9E3779B97F4A7C15ull;
    h ^= (k.out + 0xBF58476D1CE4E5B9ull) + (h << 6) + (h >> 2);
    h ^= (k.nbytes + 0x632BE59BD9B4E019ull) + (h << 6) + (h >> 2);
    h ^= (k.stream + 0x94D049BB133111EBull) + (h << 6) + (h >> 2);
    h ^= (static_cast<uint64_t>(k.dtype) << 32 | static_cast<uint32_t>(k.op)) + (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};

// A snapshotted launch (func null: the call moves nothing, e.g. one rank in place), a stream-synchronised
// program (steps > 0: func is its packed steps, hpccl/gpu/gpu_sync.py Clone), or (slot >= 0) the network
// front door's entry of a recorded call across nodes, valid while the door's generation is gen.
// The argument memory behind params and steps, and the door, are kept alive by the Python side (ReplayGroup).
struct Chain;
struct Snapshot {
  void* func;
  unsigned grid, block;
  void** params;
  uint64_t steps = 0;
  int slot = -1;
  uint64_t gen = 0;
  std::shared_ptr<Chain> hier{};  // set: a hier all_reduce, replayed as its three sub-calls' replays
};

// A hier all_reduce (hpccl/gpu/hierreplay.py): the node engine's reduce_scatter into the chain's temporary,
// the network front door's all_reduce of it (slot of generation gen), the node engine's all_gather out of it;
// counted on the user's communicator (comm, a Communicator held by the Python side) as its _run does.
struct Chain {
  Snapshot rs, ag;
  int slot;
  uint64_t gen;
  void* comm;
  void* name;
  int op;  // torch's RedOpType (the Python side finds the chain by it)
};

// The result of a replayed call: complete on the stream it ran on, as far as the host is concerned (no
// host sync anywhere); wait() and the future order the caller's current stream after it.
class ReplayWork : public c10d::Work {
 public:
  ReplayWork(int rank, c10d::OpType type, std::vector<at::Tensor> tensors,
             c10::intrusive_ptr<c10::ivalue::Future> fut, bool sync)
      : Work(rank, type), tensors_(std::move(tensors)), fut_(std::move(fut)), sync_(sync) {}

  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  std::vector<at::Tensor> result() override { return tensors_; }
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    if (!sync_) fut_->wait();  // a synchronous call ran on the caller's stream: nothing to join
    return true;
  }
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    if (!fut_) fut_ = completed(tensors_);
    return fut_;
  }

  // A future holding ``tensors``, complete after the work the current stream holds so far.
  static c10::intrusive_ptr<c10::ivalue::Future> completed(const std::vector<at::Tensor>& tensors) {
    std::vector<c10::Device> devices{tensors[0].device()};
    auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
    fut->markCompleted(c10::IValue(tensors));
    return fut;
  }

 private:
  std::vector<at::Tensor> tensors_;
  c10::intrusive_ptr<c10::ivalue::Future> fut_;
  bool sync_;
};

// A Work the Python backend returned: kept with its Python object (whose methods are the Work's).
class PyHeldWork : public c10d::Work {
 public:
  PyHeldWork(c10::intrusive_ptr<c10d::Work> work, py::object obj)
      : Work(-1, c10d::OpType::UNKNOWN), work_(std::move(work)), obj_(std::move(obj)) {}
  ~PyHeldWork() override { drop_ref(obj_); }
  bool isCompleted() override { return work_->isCompleted(); }
  bool isSuccess() const override { return work_->isSuccess(); }
  std::exception_ptr exception() const override { return work_->exception(); }
  int sourceRank() const override { return work_->sourceRank(); }
  std::vector<at::Tensor> result() override { return work_->result(); }
  bool wait(std::chrono::milliseconds timeout) override { return work_->wait(timeout); }
  void synchronize() override { work_->synchronize(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return work_->getFuture(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  py::object obj_;
};

// A synchronous call the Python backend completed on the caller's stream (it returns None for those).
class DoneWork : public c10d::Work {
 public:
  explicit DoneWork(std::vector<at::Tensor> tensors) : Work(-1, c10d::OpType::UNKNOWN), tensors_(std::move(tensors)) {}
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  std::vector<at::Tensor> result() override { return tensors_; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    if (tensors_.empty() || !tensors_[0].is_cuda()) {
      auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
      fut->markCompleted(c10::IValue(tensors_));
      return fut;
    }
    return ReplayWork::completed(tensors_);
  }

 private:
  std::vector<at::Tensor> tensors_;
};

class Native : public c10d::Backend {
 public:
  Native(int rank, int size, py::object slow) : Backend(rank, size), slow_(std::move(slow)) {}

  ~Native() override { drop_ref(slow_); }

  const std::string getBackendName() const override { return "hpccl"; }

  // The GPU communicator's replay state and the driver's entry points (hpccl/gpu/cuda_comm.py); where its
  // protocol is stream-synchronised, the program runner and cuStreamBatchMemOp too (else 0).
  void attach(uint64_t fs, uint64_t err, uint64_t pub, uint64_t tail, uint64_t launch, uint64_t capturing,
              uint64_t record, uint64_t wait, uint64_t program, uint64_t batch) {
    program_ = reinterpret_cast<program_t>(program);
    batch_ = batch;
    fs_ = reinterpret_cast<FastState*>(fs);
    err_ = reinterpret_cast<volatile uint32_t*>(err);
    pub_ = reinterpret_cast<int64_t*>(pub);
    tail_ = reinterpret_cast<void*>(tail);
    launch_ = reinterpret_cast<launch_t>(launch);
    capturing_ = reinterpret_cast<capturing_t>(capturing);
    record_ = reinterpret_cast<record_t>(record);
    wait_ = reinterpret_cast<wait_t>(wait);
    table_.clear();
  }

  // The group's stream for asynchronous calls on this device, and the event that joins it to the caller's.
  void side(int64_t stream_id, int device_index, int device_type, uint64_t handle, uint64_t join) {
    side_ = c10::Stream::unpack3(stream_id, static_cast<c10::DeviceIndex>(device_index),
                                 static_cast<c10::DeviceType>(device_type));
    side_h_ = handle;
    join_ = reinterpret_cast<void*>(join);
    have_side_ = true;
  }

  // The network front door of a group across nodes (a NetDoor, held by the Python side), its nd_fire_slot,
  // and the driver's event record and stream wait (an asynchronous call's stream waits on the caller's).
  void attach_net(uint64_t door, uint64_t fire, uint64_t record, uint64_t wait) {
    door_ = reinterpret_cast<void*>(door);
    net_fire_ = reinterpret_cast<net_fire_t>(fire);
    record_ = reinterpret_cast<record_t>(record);
    wait_ = reinterpret_cast<wait_t>(wait);
    table_.clear();
  }

  // Replay the door's entry ``slot`` (of its generation ``gen``) for later calls like this one.
  void arm_net(int coll, const at::Tensor& in, const at::Tensor& out, int op, uint64_t stream, int slot, uint64_t gen) {
    if (table_.size() >= kEntries) table_.clear();
    Snapshot s{nullptr, 0, 0, nullptr};
    s.slot = slot;
    s.gen = gen;
    table_[key(static_cast<Coll>(coll), in, out, op, stream)] = s;
  }

  // Replay this launch for later calls like this one (collective, input, output, op, stream); func 0: the
  // call moves nothing; steps > 0: func is a program's packed steps.
  void arm(int coll, const at::Tensor& in, const at::Tensor& out, int op, uint64_t stream, int64_t gen,
           uint64_t func, unsigned grid, unsigned block, uint64_t params, uint64_t steps) {
    if (steps > 0 && program_ == nullptr) return;
    room(gen);
    table_[key(static_cast<Coll>(coll), in, out, op, stream)] = snap(func, grid, block, params, steps);
  }

  // Replay a hier all_reduce like this one as its sub-calls' replays: the node engine's two snapshots (func,
  // grid, block, params, steps each, as arm() takes them; the engine attached), the door's slot of generation
  // door_gen (the door attached), and the count entry with the user's communicator and the collective's name.
  void arm_hier(const at::Tensor& t, int op, uint64_t stream, int64_t gen, uint64_t rs_func, unsigned rs_grid,
                unsigned rs_block, uint64_t rs_params, uint64_t rs_steps, int slot, uint64_t door_gen,
                uint64_t ag_func, unsigned ag_grid, unsigned ag_block, uint64_t ag_params, uint64_t ag_steps,
                uint64_t count, uint64_t comm, uint64_t name) {
    if ((rs_steps > 0 || ag_steps > 0) && program_ == nullptr) return;
    room(gen);
    count_ = reinterpret_cast<count_t>(count);
    auto c = std::make_shared<Chain>();
    c->rs = snap(rs_func, rs_grid, rs_block, rs_params, rs_steps);
    c->ag = snap(ag_func, ag_grid, ag_block, ag_params, ag_steps);
    c->slot = slot;
    c->gen = door_gen;
    c->comm = reinterpret_cast<void*>(comm);
    c->name = reinterpret_cast<void*>(name);
    c->op = op;
    Snapshot s{nullptr, 0, 0, nullptr};
    s.hier = std::move(c);
    table_[key(kAllReduce, t, t, op, stream)] = s;
  }

  // Coalescing (torch's _start/_end_coalescing): every call goes to the Python backend meanwhile.
  void hold(bool on) { held_ = on; }
  int64_t replays() const { return replays_; }
  int64_t generation() const { return gen_; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (ready() && tensors.size() == 1 && !opts.sparseIndices.has_value()) {
      if (auto w = replay(kAllReduce, tensors[0], tensors[0], static_cast<int>(opts.reduceOp.op_), opts.asyncOp,
                          tensors, c10d::OpType::ALLREDUCE, "hpccl:allreduce"))
        return w;
    }
    py::gil_scoped_acquire gil;
    return held(slow_("allreduce", tensors, opts), tensors);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& opts) override {
    std::vector<at::Tensor> result{out};
    if (ready()) {
      if (auto w = replay(kAllGather, in, out, 0, opts.asyncOp, result, c10d::OpType::_ALLGATHER_BASE,
                          "hpccl:_allgather_base"))
        return w;
    }
    py::gil_scoped_acquire gil;
    return held(slow_("allgather_base", out, in, opts), result);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions& opts) override {
    std::vector<at::Tensor> result{out};
    if (ready()) {
      if (auto w = replay(kReduceScatter, in, out, static_cast<int>(opts.reduceOp.op_), opts.asyncOp, result,
                          c10d::OpType::_REDUCE_SCATTER_BASE, "hpccl:_reduce_scatter_base"))
        return w;
    }
    py::gil_scoped_acquire gil;
    return held(slow_("reduce_scatter_base", out, in, opts), result);
  }

 private:
  static constexpr size_t kEntries = 512;

  // An arm's place in the table: emptied when the engine's generation moved on, or when it is full.
  void room(int64_t gen) {
    if (gen != gen_) {
      table_.clear();
      gen_ = gen;
    }
    if (table_.size() >= kEntries) table_.clear();
  }

  static Snapshot snap(uint64_t func, unsigned grid, unsigned block, uint64_t params, uint64_t steps) {
    Snapshot s{reinterpret_cast<void*>(func), grid, block, reinterpret_cast<void**>(params)};
    s.steps = steps;
    return s;
  }

  static Key key(Coll coll, const at::Tensor& in, const at::Tensor& out, int op, uint64_t stream) {
    return Key{reinterpret_cast<uint64_t>(in.data_ptr()), reinterpret_cast<uint64_t>(out.data_ptr()),
               static_cast<uint64_t>(in.nbytes()), stream, static_cast<int32_t>(in.scalar_type()),
               static_cast<int32_t>(coll) << 24 | op};
  }

  bool ready() const { return (fs_ != nullptr || door_ != nullptr) && !held_; }

  // Replay the snapshot of this call, if there is one and nothing forbids it; else a null Work.
  c10::intrusive_ptr<c10d::Work> replay(Coll coll, const at::Tensor& in, const at::Tensor& out, int op, bool async,
                                        const std::vector<at::Tensor>& result, c10d::OpType type, const char* name) {
    if (!in.is_cuda() || !out.is_cuda() || in.is_sparse() || !in.is_contiguous() || !out.is_contiguous() ||
        in.device() != out.device())
      return {};
    if (fs_ != nullptr && (!fs_->live || fs_->held || fs_->gen != gen_ || *err_ != 0)) return {};
    if (async && !have_side_) return {};
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    c10::Stream cur = impl.getStream(in.device());
    const uint64_t cur_h = reinterpret_cast<uint64_t>(cur.native_handle());
    const uint64_t st = async ? side_h_ : cur_h;
    auto it = table_.find(key(coll, in, out, op, st));
    if (it == table_.end()) return {};
    RECORD_FUNCTION(name, std::vector<c10::IValue>());
    const Snapshot& s = it->second;
    const std::shared_ptr<Chain> chain = s.hier;  // held: a chain's rest runs Python, which may re-arm the table
    const bool net = s.slot >= 0, hier = chain != nullptr;
    if (!net && fs_ == nullptr) return {};
    if ((net || hier) && door_ == nullptr) return {};
    const bool moves = net || hier || s.func != nullptr;
    if (moves) {
      if (async) {  // hpccl's stream starts after the caller's work so far
        record_(join_, reinterpret_cast<void*>(cur_h));
        wait_(reinterpret_cast<void*>(st), join_, 0);
      }
      if (!(hier ? fire_hier(*chain, in, st) : net ? fire_net(s, st) : launch(s, st))) return {};
      if (async) {  // the caching allocator keeps both buffers until hpccl's stream is done with them
        impl.recordDataPtrOnStream(in.storage().data_ptr(), side_);
        if (!out.is_same(in)) impl.recordDataPtrOnStream(out.storage().data_ptr(), side_);
      }
    }
    if (!net && !hier) count_launch();  // the door counts its calls itself, a chain its own
    ++replays_;
    if (!async) return c10::make_intrusive<ReplayWork>(rank_, type, result, nullptr, true);
    if (!moves)
      return c10::make_intrusive<ReplayWork>(rank_, type, result, ReplayWork::completed(result), false);
    c10::Stream prev = impl.exchangeStream(side_);  // the future completes after hpccl's stream
    auto fut = ReplayWork::completed(result);
    impl.exchangeStream(prev);
    return c10::make_intrusive<ReplayWork>(rank_, type, result, std::move(fut), false);
  }

  // A call across nodes: the door replays the recorded network call on st (its own stream order, capture
  // check and bookkeeping), under the GIL; false when it declines (a group open, the communicator gone,
  // capturing, the recording dropped), and the Python backend then reports or captures the call.
  bool fire_net(const Snapshot& s, uint64_t st) {
    py::gil_scoped_acquire gil;
    const int rc = net_fire_(door_, s.slot, s.gen, st);
    if (rc < 0) throw py::error_already_set();  // a driver call failed: raised as the Python path raises it
    return rc != 0;
  }

  void count_launch() {  // CudaComm._count
    ++fs_->seq;
    if (pub_ != nullptr) *pub_ = fs_->seq;
  }

  // A hier all_reduce from its chain, under the GIL (the door and the count entry need it): declined (false,
  // nothing enqueued) while st is capturing (a graph must own hier's temporaries), the user's communicator
  // would not take a replay, or the first launch cannot be made; then counted, and the rest replayed. A
  // sub-call that cannot be replayed after that (the door declines, the last launch fails) runs the Python
  // backend's rest of the chain from there (hierreplay.Chain.run).
  bool fire_hier(const Chain& c, const at::Tensor& t, uint64_t st) {
    int cap = 0;
    if (capturing_(reinterpret_cast<void*>(st), &cap) != 0 || cap) return false;
    py::gil_scoped_acquire gil;
    const int open = count_(c.comm, c.name, 0);
    if (open < 0) throw py::error_already_set();
    if (open == 0 || !launch(c.rs, st)) return false;
    count_launch();
    if (count_(c.comm, c.name, 1) < 0) throw py::error_already_set();
    const int rc = net_fire_(door_, c.slot, c.gen, st);
    if (rc < 0) throw py::error_already_set();
    if (rc == 0) {
      slow_("hier_rest", 1, t, c.op, st);
    } else if (launch(c.ag, st)) {
      count_launch();
    } else {
      slow_("hier_rest", 2, t, c.op, st);
    }
    return true;
  }

  // CudaComm.fire's driver work: order after the previous stream, capture check, launch (or the program's
  // operations), tail record.
  bool launch(const Snapshot& s, uint64_t st) {
    void* stream = reinterpret_cast<void*>(st);
    int cap = 0;
    if (capturing_(stream, &cap) != 0) cap = 0;
    if (st != fs_->last_stream) {  // CudaComm._order
      const uint64_t last = fs_->last_stream;
      fs_->last_stream = st;
      if (last != kNoStream && fs_->tail_live && !cap) wait_(stream, tail_, 0);
    }
    if (s.steps > 0) {  // CudaComm._run_compiled
      uint64_t done = 0;
      const int rc = program_(reinterpret_cast<uint64_t>(launch_), reinterpret_cast<uint64_t>(capturing_),
                              reinterpret_cast<uint64_t>(record_), batch_, reinterpret_cast<uint64_t>(s.func),
                              s.steps, st, reinterpret_cast<uint64_t>(tail_), &done);
      if (rc > 0 && done > 0)  // some operations are on the stream already: not retried, reported
        throw std::runtime_error("hpccl: a stream operation failed after " + std::to_string(done) + " of " +
                                 std::to_string(s.steps) + " were enqueued (CUresult " + std::to_string(rc) + ")");
      if (rc > 0) return false;
      fs_->tail_live = rc == 0;
      return true;
    }
    if (launch_(s.func, s.grid, 1, 1, s.block, 1, 1, 0, stream, s.params, nullptr) != 0) return false;
    if (cap) {
      fs_->tail_live = 0;
    } else {
      record_(tail_, stream);
      fs_->tail_live = 1;
    }
    return true;
  }

  // The Work the Python backend returned (None: a synchronous call it completed on the caller's stream).
  static c10::intrusive_ptr<c10d::Work> held(py::object out, const std::vector<at::Tensor>& result) {
    if (out.is_none()) return c10::make_intrusive<DoneWork>(result);
    auto work = out.cast<c10::intrusive_ptr<c10d::Work>>();
    return c10::make_intrusive<PyHeldWork>(std::move(work), std::move(out));
  }

  py::object slow_;
  void* door_ = nullptr;
  net_fire_t net_fire_ = nullptr;
  count_t count_ = nullptr;
  FastState* fs_ = nullptr;
  volatile uint32_t* err_ = nullptr;
  int64_t* pub_ = nullptr;
  void* tail_ = nullptr;
  launch_t launch_ = nullptr;
  capturing_t capturing_ = nullptr;
  record_t record_ = nullptr;
  wait_t wait_ = nullptr;
  program_t program_ = nullptr;
  uint64_t batch_ = 0;
  c10::Stream side_{c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CPU)};
  uint64_t side_h_ = 0;
  void* join_ = nullptr;
  bool have_side_ = false;
  bool held_ = false;
  int64_t gen_ = -1;
  int64_t replays_ = 0;
  std::unordered_map<Key, Snapshot, KeyHash> table_;
};

}  // namespace

PYBIND11_MODULE(hpccl_torch_native, m) {
  m.doc() = "hpccl's compiled torch backend (replays of all_reduce, all_gather_into_tensor, reduce_scatter_tensor)";
  py::class_<Native, c10d::Backend, c10::intrusive_ptr<Native>>(m, "Native")
      .def(py::init<int, int, py::object>(), py::arg("rank"), py::arg("size"), py::arg("slow"))
      .def("attach", &Native::attach)
      .def("side", &Native::side)
      .def("arm", &Native::arm)
      .def("attach_net", &Native::attach_net)
      .def("arm_net", &Native::arm_net)
      .def("arm_hier", &Native::arm_hier)
      .def("hold", &Native::hold)
      .def_property_readonly("replays", &Native::replays)
      .def_property_readonly("generation", &Native::generation);
}
