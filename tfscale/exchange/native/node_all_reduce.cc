// The shared-memory exchange of tfscale.exchange.shared_memory as TensorFlow ops: the node's
// whole all-reduce (TfscaleNodeAllReduce, a job on one node), and its two halves around a
// cross-node sum (TfscaleNodeReduceScatter, then TfscaleNodeAllGather, a job on several nodes).
//
// The same segment, protocol and order of additions as the module's Python, which creates and
// maps the segment and hands its address to these ops (the layout and the steps of a call are
// in that module's doc). Run from TensorFlow's executor, a call needs no Python: no
// tf.numpy_function around it, no interpreter or lock of its own, its outputs handed to the
// optimizer as views of the results buffer (or as copies).
//
// Built on first use by tfscale.exchange.native (g++ and TensorFlow's own headers).

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tensorflow/core/common_runtime/dma_helper.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

namespace tfscale {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::DataType;
using tensorflow::Tensor;

constexpr int64_t kLine = 64;  // bytes per counter (shared_memory._LINE)
enum Kind { kAttached = 0, kWritten = 1, kReduced = 2, kGathered = 3 };
constexpr int kKinds = 4;
// Waiting: yield the core this long, then check every kSleep (shared_memory._SPINS, _SLEEP_S),
// and check that the processes waited for are alive every kLiveness.
constexpr auto kSpin = std::chrono::milliseconds(2);
constexpr auto kSleep = std::chrono::microseconds(50);
constexpr auto kLiveness = std::chrono::milliseconds(200);

// Memory that the segment owns, seen by TensorFlow as a tensor's buffer.
class Borrowed : public tensorflow::TensorBuffer {
 public:
  Borrowed(void* data, size_t bytes) : TensorBuffer(data), bytes_(bytes) {}
  size_t size() const override { return bytes_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tensorflow::AllocationDescription*) const override {}
  bool OwnsMemory() const override { return false; }

 private:
  size_t bytes_;
};

bool Alive(int64_t pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return true;
  return text[close + 2] != 'Z';
}

// What every op on a segment shares: its attrs, counters, buffers, sum and waits.
template <typename T>
class SegmentKernel : public OpKernel {
 public:
  explicit SegmentKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t address = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("address", &address));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("offsets", &offsets_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("length", &length_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("index", &index_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("size", &size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("ranks", &ranks_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_s", &timeout_s_));
    OP_REQUIRES(ctx, size_ >= 2 && index_ >= 0 && index_ < size_ &&
                         static_cast<int64_t>(ranks_.size()) == size_ && length_ % size_ == 0,
                tensorflow::errors::InvalidArgument(name(), ": bad segment attrs"));
    base_ = reinterpret_cast<char*>(address);
    chunk_ = length_ / size_;
  }

 protected:
  // The call's number is shared with the module's Python calls on the same segment: one more
  // than the last this process finished.
  int64_t Call() { return Flag(kGathered, index_)[0] + 1; }

  // shared_memory.Segment.reduce_scatter: copies the other processes' chunks of ``inputs``
  // (tensors laid out at ``offsets_``) to their buffers, waits for theirs, and sums this
  // process's chunk (times ``scale``) into call ``c``'s results buffer.
  Status ReduceScatter(OpKernelContext* ctx, int64_t c, T scale) {
    TF_RETURN_IF_ERROR(ScatterParts(ctx, c));
    ForPieces(ctx, index_ * chunk_, (index_ + 1) * chunk_,
              [&](int64_t lo, int64_t hi, const T* mine) { Sum(lo, hi, mine, c, scale); });
    return Status();
  }

  // The first half of ReduceScatter: every other process's chunk of ``inputs`` copied to its
  // buffer, and every process's parts of this process's chunk in place.
  Status ScatterParts(OpKernelContext* ctx, int64_t c) {
    TF_RETURN_IF_ERROR(Wait(kGathered, c - 1, "finish exchange " + std::to_string(c - 1)));
    for (int64_t j = 0; j < size_; ++j) {
      if (j == index_) continue;
      T* into = Buffer(((index_ - j) % size_ + size_) % size_, c);
      ForPieces(ctx, j * chunk_, (j + 1) * chunk_, [&](int64_t lo, int64_t hi, const T* src) {
        memcpy(into + lo, src, (hi - lo) * sizeof(T));
      });
    }
    Publish(kWritten, c);
    return Wait(kWritten, c, "write its tensors for exchange " + std::to_string(c));
  }

  // shared_memory.Segment.all_gather, once this process's chunk of the results is in place:
  // waits for every chunk, hands out output t, of shape ``shape_of(t)``, as a view of the
  // results buffer (``views``) or as a copy, and counts the call finished.
  template <typename ShapeOf>
  Status AllGather(OpKernelContext* ctx, int64_t c, DataType dtype, ShapeOf shape_of,
                   bool views) {
    Publish(kReduced, c);
    TF_RETURN_IF_ERROR(Wait(kReduced, c, "write its chunk for exchange " + std::to_string(c)));
    T* results = Buffer(1, c);
    for (size_t t = 0; t < offsets_.size(); ++t) {
      const tensorflow::TensorShape& shape = shape_of(t);
      T* from = results + offsets_[t];
      const int64_t count = shape.num_elements();
      if (views) {
        auto* buffer = new Borrowed(from, count * sizeof(T));
        Tensor out(dtype, shape, buffer);
        buffer->Unref();
        ctx->set_output(t, out);
      } else {
        Tensor* out = nullptr;
        TF_RETURN_IF_ERROR(ctx->allocate_output(t, shape, &out));
        memcpy(out->flat<T>().data(), from, count * sizeof(T));
      }
    }
    Publish(kGathered, c);
    return Status();
  }

  Status CheckInputs(OpKernelContext* ctx) const {
    if (ctx->num_inputs() == static_cast<int>(offsets_.size())) return Status();
    return tensorflow::errors::InvalidArgument(name(), ": ", ctx->num_inputs(),
                                               " inputs for ", offsets_.size(), " offsets");
  }

  int64_t* Flag(int kind, int64_t i) {
    return reinterpret_cast<int64_t*>(base_ + (kind * size_ + i) * kLine);
  }
  // A counter is published after the data it stands for (x86-64 keeps stores in order).
  void Publish(int kind, int64_t c) { __atomic_store_n(Flag(kind, index_), c, __ATOMIC_RELEASE); }
  // shared_memory.Segment._buffer: distance 1 is the results, by the call's parity.
  T* Buffer(int64_t distance, int64_t call) {
    const int64_t b = distance == 1 ? call % 2 : distance;
    return reinterpret_cast<T*>(base_ + kKinds * size_ * kLine) + b * length_;
  }
  // shared_memory.Segment.weights: the region after the buffers, where the sharded update
  // leaves the node's weights (and its processes' variables keep them).
  T* Weights() {
    return reinterpret_cast<T*>(base_ + kKinds * size_ * kLine) + std::max<int64_t>(size_, 2) *
                                                                       length_;
  }

  // fn(lo, hi, source) for each exchanged input's part of the buffer range [start, stop) (the
  // first offsets_.size() inputs: an op may take more, after them).
  template <typename Fn>
  void ForPieces(OpKernelContext* ctx, int64_t start, int64_t stop, Fn fn) {
    for (size_t t = 0; t < offsets_.size(); ++t) {
      const Tensor& in = ctx->input(t);
      const int64_t offset = offsets_[t], lo = std::max(offset, start);
      const int64_t hi = std::min(offset + in.NumElements(), stop);
      if (lo < hi) fn(lo, hi, in.flat<T>().data() + (lo - offset));
    }
  }

  // shared_memory.Segment._sum, element by element in the same order: two parts added
  // (either way round is the same, bit for bit) and scaled; three or more added in local index
  // order, then scaled. The sum goes where the next process's part lies.
  void Sum(int64_t lo, int64_t hi, const T* mine, int64_t c, T scale) {
    T* total = Buffer(1, c) + lo;
    const int64_t count = hi - lo;
    if (size_ == 2) {
      if (scale == T(1)) {
        for (int64_t k = 0; k < count; ++k) total[k] += mine[k];
      } else {
        for (int64_t k = 0; k < count; ++k) total[k] = (total[k] + mine[k]) * scale;
      }
      return;
    }
    std::vector<const T*> parts(size_);
    for (int64_t k = 0; k < size_; ++k) {
      parts[k] = k == index_ ? mine : Buffer(((k - index_) % size_ + size_) % size_, c) + lo;
    }
    for (int64_t e = 0; e < count; ++e) {
      T acc = parts[0][e] + parts[1][e];
      for (int64_t k = 2; k < size_; ++k) acc += parts[k][e];
      if (scale != T(1)) acc *= scale;
      total[e] = acc;
    }
  }

  // shared_memory.SharedMemoryGroup._wait: every process's counter of ``kind`` >= value.
  Status Wait(int kind, int64_t value, const std::string& what) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    auto check = start + kLiveness;
    std::vector<int64_t> behind;
    behind.reserve(size_);
    while (true) {
      behind.clear();
      for (int64_t i = 0; i < size_; ++i) {
        if (__atomic_load_n(Flag(kind, i), __ATOMIC_ACQUIRE) < value) behind.push_back(i);
      }
      if (behind.empty()) return Status();
      const auto now = Clock::now();
      if (now - start < kSpin) {
        sched_yield();
        continue;
      }
      if (now - start > std::chrono::duration<double>(timeout_s_)) {
        std::ostringstream message;
        message << "shared-memory exchange: " << Who(behind) << " of this node did not " << what
                << " within " << Seconds() << " s (a peer died or stalled)";
        return tensorflow::errors::DeadlineExceeded(message.str());
      }
      if (now > check) {
        check = now + kLiveness;
        std::vector<int64_t> gone;
        std::ostringstream pids;
        for (int64_t i : behind) {
          const int64_t pid = Flag(kAttached, i)[0];
          if (pid > 0 && !Alive(pid)) {
            pids << (gone.empty() ? "" : ", ") << pid;
            gone.push_back(i);
          }
        }
        if (!gone.empty()) {
          std::ostringstream message;
          message << "shared-memory exchange: " << Who(gone) << " of this node (pid "
                  << pids.str() << ") exited before they could " << what << " (a peer died)";
          return tensorflow::errors::Unavailable(message.str());
        }
      }
      std::this_thread::sleep_for(kSleep);
    }
  }

  // "rank(s) [3] (local process(es) [1])", as shared_memory.SharedMemoryGroup._who says it.
  std::string Who(const std::vector<int64_t>& local) const {
    std::ostringstream ranks, indices;
    for (size_t k = 0; k < local.size(); ++k) {
      ranks << (k ? ", " : "") << ranks_[local[k]];
      indices << (k ? ", " : "") << local[k];
    }
    return "rank(s) [" + ranks.str() + "] (local process(es) [" + indices.str() + "])";
  }

  std::string Seconds() const {  // Python's format(timeout_s, "g")
    char text[32];
    snprintf(text, sizeof(text), "%g", timeout_s_);
    return text;
  }

  char* base_ = nullptr;
  std::vector<int64_t> offsets_;
  int64_t length_ = 0, index_ = 0, size_ = 0, chunk_ = 0;
  std::vector<int64_t> ranks_;
  float timeout_s_ = 0;
};

// The scale as NumPy applies it: 1 / divisor in double, then in the tensors' dtype.
template <typename T>
T ScaleOf(int64_t divisor) {
  return static_cast<T>(1.0 / static_cast<double>(divisor));
}

// The node's all-reduce (SharedMemoryGroup.all_reduce): the mean's scale applied in the sum.
template <typename T>
class NodeAllReduce : public SegmentKernel<T> {
 public:
  explicit NodeAllReduce(OpKernelConstruction* ctx) : SegmentKernel<T>(ctx) {
    int64_t divisor = 1;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("divisor", &divisor));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("views", &views_));
    scale_ = ScaleOf<T>(divisor);
  }

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, this->CheckInputs(ctx));
    const int64_t c = this->Call();
    OP_REQUIRES_OK(ctx, this->ReduceScatter(ctx, c, scale_));
    // Each output has its input's shape.
    OP_REQUIRES_OK(ctx, this->AllGather(
                            ctx, c, ctx->input(0).dtype(),
                            [ctx](size_t t) -> const tensorflow::TensorShape& {
                              return ctx->input(t).shape();
                            },
                            views_));
  }

 private:
  bool views_ = true;
  T scale_ = T(1);
};

// SharedMemoryGroup.reduce_scatter: the node's sum of this process's chunk, as a new tensor
// (the cross-node phase's input).
template <typename T>
class NodeReduceScatter : public SegmentKernel<T> {
 public:
  using SegmentKernel<T>::SegmentKernel;

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES_OK(ctx, this->CheckInputs(ctx));
    const int64_t c = this->Call();
    OP_REQUIRES_OK(ctx, this->ReduceScatter(ctx, c, T(1)));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({this->chunk_}), &out));
    memcpy(out->flat<T>().data(), this->Buffer(1, c) + this->index_ * this->chunk_,
           this->chunk_ * sizeof(T));
  }
};

// SharedMemoryGroup.all_gather after a reduce_scatter: this process's chunk replaced by
// ``chunk`` (its cross-node sum) divided by ``divisor``, then every chunk gathered.
template <typename T>
class NodeAllGather : public SegmentKernel<T> {
 public:
  explicit NodeAllGather(OpKernelConstruction* ctx) : SegmentKernel<T>(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("divisor", &divisor_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("views", &views_));
    std::vector<tensorflow::PartialTensorShape> shapes;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shapes", &shapes));
    OP_REQUIRES(ctx, shapes.size() == this->offsets_.size(),
                tensorflow::errors::InvalidArgument(this->name(), ": ", shapes.size(), " shapes for ",
                                                    this->offsets_.size(), " offsets"));
    for (const auto& shape : shapes) {
      tensorflow::TensorShape full;
      OP_REQUIRES(ctx, shape.AsTensorShape(&full),
                  tensorflow::errors::InvalidArgument(this->name(), ": a shape not fully known"));
      shapes_.push_back(full);
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& chunk = ctx->input(0);
    OP_REQUIRES(ctx, chunk.NumElements() == this->chunk_,
                tensorflow::errors::InvalidArgument(this->name(), ": a chunk of ", chunk.NumElements(),
                                                    " elements for ", this->chunk_));
    // The same call as the reduce_scatter before it: this process has not finished it yet.
    const int64_t c = this->Call();
    OP_REQUIRES(ctx, this->Flag(kWritten, this->index_)[0] == c,
                tensorflow::errors::FailedPrecondition(
                    this->name(), ": no TfscaleNodeReduceScatter made exchange ", c,
                    " on this segment; an all-gather pairs with the reduce-scatter before it"));
    T* total = this->Buffer(1, c) + this->index_ * this->chunk_;
    const T* in = chunk.flat<T>().data();
    if (divisor_ != 1) {  // NumPy's divide: the int divisor in the chunk's dtype
      const T divisor = static_cast<T>(divisor_);
      for (int64_t k = 0; k < this->chunk_; ++k) total[k] = in[k] / divisor;
    } else {
      memcpy(total, in, this->chunk_ * sizeof(T));
    }
    OP_REQUIRES_OK(ctx, this->AllGather(
                            ctx, c, chunk.dtype(),
                            [this](size_t t) -> const tensorflow::TensorShape& {
                              return shapes_[t];
                            },
                            views_));
  }

 private:
  int64_t divisor_ = 1;
  bool views_ = true;
  std::vector<tensorflow::TensorShape> shapes_;
};


// The node's all-reduce of gradients and the SGD momentum update that applies them, with the
// update sharded (ZeRO's stage 1, inside a node): each process sums only its chunk, as in
// NodeAllReduce, then applies Keras' momentum update to that chunk of the variables and of its
// momentum (ResourceApplyKerasMomentum's arithmetic, element by element), and writes the new
// weights of the chunk to the segment's weights region. The variables keep their weights there:
// once the region holds every chunk, each variable's buffer becomes its place in the region
// (the region's memory, lent as a TensorBuffer), so the next call updates it in place and no
// process copies the others' chunks in. A variable whose buffer was replaced since (an assign,
// a copy made for a reader still holding the old values) is bound again at the end of the
// call. A place that another variable of this process holds is an error: each optimizer has a
// segment of its own (tfscale.exchange.sharded_update), so two models never share a region,
// whose writes would change both. Every process ends with the same weights, having updated
// 1 / size of them; the momentum is up to date only in this process's chunk (the others are
// brought in by tfscale.exchange.sharded_update before anything reads them).
//
// Inputs: N gradients, then the N variables and the N momentum variables (resource handles,
// each of its gradient's shape and dtype), the learning rate and the momentum (scalars).
// Output: the exchange's number on the segment, once the variables hold the new weights.
template <typename T>
class NodeAllReduceMomentum : public SegmentKernel<T> {
 public:
  explicit NodeAllReduceMomentum(OpKernelConstruction* ctx) : SegmentKernel<T>(ctx) {
    int64_t divisor = 1;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("divisor", &divisor));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("use_nesterov", &nesterov_));
    scale_ = ScaleOf<T>(divisor);
  }

  void Compute(OpKernelContext* ctx) override {
    const int64_t n = static_cast<int64_t>(this->offsets_.size());
    OP_REQUIRES(ctx, ctx->num_inputs() == 3 * n + 2,
                tensorflow::errors::InvalidArgument(this->name(), ": ", ctx->num_inputs(),
                                                    " inputs for ", n, " offsets"));
    const T lr = ctx->input(3 * n).scalar<T>()();
    const T momentum = ctx->input(3 * n + 1).scalar<T>()();
    std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>> vars(2 * n);
    for (int64_t i = 0; i < 2 * n; ++i) {
      OP_REQUIRES_OK(ctx, tensorflow::LookupResource(
                              ctx, tensorflow::HandleFromInput(ctx, n + i), &vars[i]));
    }
    // Locked in address order (as TensorFlow's training ops lock theirs) for the whole call.
    std::vector<tensorflow::mutex*> locks;
    for (auto& var : vars) locks.push_back(var->mu());
    std::sort(locks.begin(), locks.end());
    locks.erase(std::unique(locks.begin(), locks.end()), locks.end());
    for (auto* mu : locks) mu->lock();
    Status status = Run(ctx, n, lr, momentum, vars);
    for (auto it = locks.rbegin(); it != locks.rend(); ++it) (*it)->unlock();
    OP_REQUIRES_OK(ctx, status);
  }

 private:
  using Vars = std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>>;

  Status Run(OpKernelContext* ctx, int64_t n, T lr, T momentum, Vars& vars) {
    std::vector<T*> weights(n), accums(n);
    T* region = this->Weights();
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t which = 0; which < 2; ++which) {
        tensorflow::Var* var = vars[which * n + t].get();
        Tensor* tensor = var->tensor();
        if (!tensor->IsInitialized() || tensor->dtype() != ctx->input(t).dtype() ||
            tensor->NumElements() != ctx->input(t).NumElements()) {
          return tensorflow::errors::InvalidArgument(
              this->name(), ": ", which ? "momentum" : "variable", " ", t,
              " is not initialised or does not match its gradient's dtype and size");
        }
        TF_RETURN_IF_ERROR(Own(ctx, var, which ? nullptr : region + this->offsets_[t]));
        (which ? accums : weights)[t] = var->tensor()->template flat<T>().data();
      }
    }
    for (int64_t t = 0; t < n; ++t) {  // an unbound variable's place, before anything is written
      T* place = region + this->offsets_[t];
      if (weights[t] != place && !Free(vars[t].get(), place)) {
        return tensorflow::errors::FailedPrecondition(
            this->name(), ": variable ", t, "'s place in the segment's weights region is ",
            "another variable's (each optimizer's sharded update has a segment of its own; ",
            "tfscale.exchange.sharded_update)");
      }
    }
    const int64_t c = this->Call();
    TF_RETURN_IF_ERROR(this->ScatterParts(ctx, c));
    T* results = this->Buffer(1, c);
    const int64_t start = this->index_ * this->chunk_, stop = start + this->chunk_;
    for (int64_t t = 0; t < n; ++t) {  // this chunk: sum, update, new weights to the results
      const int64_t offset = this->offsets_[t];
      const int64_t lo = std::max(offset, start);
      const int64_t hi = std::min(offset + ctx->input(t).NumElements(), stop);
      const T* mine = ctx->input(t).template flat<T>().data();
      for (int64_t b = lo; b < hi; b += kBlock) {  // a block's sum is still in the cache
        const int64_t e = std::min(b + kBlock, hi);
        this->Sum(b, e, mine + (b - offset), c, scale_);
        Update(results + b, weights[t] + (b - offset), region + b, accums[t] + (b - offset),
               e - b, lr, momentum);
      }
    }
    this->Publish(kReduced, c);
    TF_RETURN_IF_ERROR(this->Wait(kReduced, c, "update its chunk in exchange " +
                                                   std::to_string(c)));
    for (int64_t t = 0; t < n; ++t) {  // the region holds every chunk's new weights
      T* place = region + this->offsets_[t];
      if (weights[t] != place) Bind(vars[t], place);
    }
    this->Publish(kGathered, c);
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, tensorflow::TensorShape({}), &out));
    out->scalar<int64_t>()() = c;
    return Status();
  }

  // ResourceApplyKerasMomentum on ``count`` elements, the gradient read from ``total``, the
  // weight from ``weight`` and the new weight written to ``out`` (``weight`` itself once the
  // variable is bound to the region): the same operations in the same order, none fused.
  void Update(const T* total, const T* weight, T* out, T* accum, int64_t count, T lr,
              T momentum) const {
    if (nesterov_) {
      for (int64_t k = 0; k < count; ++k) {
        const T g = total[k];
        const T m = accum[k] * momentum - g * lr;
        accum[k] = m;
        out[k] = weight[k] + (m * momentum - g * lr);
      }
      return;
    }
    for (int64_t k = 0; k < count; ++k) {
      const T m = accum[k] * momentum - total[k] * lr;
      accum[k] = m;
      out[k] = weight[k] + m;
    }
  }

  // The variables of this process bound to places in weights regions (kept alive: the
  // region still holds their weights).
  struct Holders {
    tensorflow::mutex mu;
    std::map<const void*, tensorflow::core::RefCountPtr<tensorflow::Var>> at;
  };
  static Holders& Bound() {
    static auto* holders = new Holders();
    return *holders;
  }

  // Whether ``place`` in a weights region is free for ``var``: no other variable holds it.
  static bool Free(tensorflow::Var* var, const T* place) {
    Holders& holders = Bound();
    tensorflow::mutex_lock lock(holders.mu);
    auto found = holders.at.find(place);
    return found == holders.at.end() || found->second.get() == var;
  }

  // Makes ``place`` in the weights region ``var``'s buffer (a place that Free found free);
  // the variable's old buffer is let go (readers that still hold it keep the values they
  // read).
  static void Bind(tensorflow::core::RefCountPtr<tensorflow::Var>& var, T* place) {
    {
      Holders& holders = Bound();
      tensorflow::mutex_lock lock(holders.mu);
      if (holders.at.find(place) == holders.at.end()) {
        var->Ref();
        holders.at.emplace(place, tensorflow::core::RefCountPtr<tensorflow::Var>(var.get()));
      }
    }
    Tensor* tensor = var->tensor();
    auto* buffer = new Borrowed(place, tensor->TotalBytes());
    Tensor bound(tensor->dtype(), tensor->shape(), buffer);
    buffer->Unref();
    *tensor = bound;
  }

  // The variable's buffer made this op's own to write (a read that still holds it keeps the
  // old values), as TensorFlow's training ops do before an update. A variable bound to its
  // ``place`` in the weights region holds memory that the segment lends: TensorFlow never
  // counts such a buffer as the tensor's own (so no op takes it over to write in), and it is
  // this op's to write when nothing else holds it.
  static Status Own(OpKernelContext* ctx, tensorflow::Var* var, const T* place) {
    Tensor* tensor = var->tensor();
    if (!var->copy_on_read_mode.load() &&
        (tensor->RefCountIsOne() ||
         (place != nullptr && tensor->data() == place &&
          tensorflow::DMAHelper::buffer(tensor)->RefCountIsOne()))) {
      return Status();
    }
    Tensor copy;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensor->dtype(), tensor->shape(), &copy));
    memcpy(copy.data(), tensor->data(), tensor->TotalBytes());
    *tensor = copy;
    return Status();
  }

  static constexpr int64_t kBlock = 8192;  // 32 KiB of float32
  bool nesterov_ = false;
  T scale_ = T(1);
};
}  // namespace

// The attrs that place an op on its segment (tfscale.exchange.hierarchical passes them).
#define TFSCALE_SEGMENT_ATTRS                  \
  Attr("T: {float, double}")                   \
      .Attr("address: int")                    \
      .Attr("offsets: list(int)")              \
      .Attr("length: int")                     \
      .Attr("index: int")                      \
      .Attr("size: int")                       \
      .Attr("ranks: list(int)")                \
      .Attr("timeout_s: float")

REGISTER_OP("TfscaleNodeAllReduce")
    .Input("tensors: N * T")
    .Output("sums: N * T")
    .Attr("N: int >= 1")
    .TFSCALE_SEGMENT_ATTRS
    .Attr("divisor: int = 1")
    .Attr("views: bool = true")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return Status();
    });

REGISTER_OP("TfscaleNodeReduceScatter")
    .Input("tensors: N * T")
    .Output("chunk: T")
    .Attr("N: int >= 1")
    .TFSCALE_SEGMENT_ATTRS
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int64_t length = 0, size = 1;
      TF_RETURN_IF_ERROR(c->GetAttr("length", &length));
      TF_RETURN_IF_ERROR(c->GetAttr("size", &size));
      c->set_output(0, c->Vector(size > 0 ? length / size : 0));
      return Status();
    });

REGISTER_OP("TfscaleNodeAllGather")
    .Input("chunk: T")
    .Output("sums: N * T")
    .Attr("N: int >= 1")
    .Attr("shapes: list(shape)")
    .TFSCALE_SEGMENT_ATTRS
    .Attr("divisor: int = 1")
    .Attr("views: bool = true")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      std::vector<tensorflow::PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
      for (size_t i = 0; i < shapes.size() && static_cast<int>(i) < c->num_outputs(); ++i) {
        tensorflow::shape_inference::ShapeHandle out;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &out));
        c->set_output(i, out);
      }
      return Status();
    });

REGISTER_OP("TfscaleNodeAllReduceMomentum")
    .Input("gradients: N * T")
    .Input("variables: N * resource")
    .Input("momentums: N * resource")
    .Input("learning_rate: T")
    .Input("momentum: T")
    .Attr("N: int >= 1")
    .TFSCALE_SEGMENT_ATTRS
    .Attr("divisor: int = 1")
    .Output("exchange: int64")
    .Attr("use_nesterov: bool = false")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

#define TFSCALE_KERNELS(op, kernel)                                                          \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name(op).Device(tensorflow::DEVICE_CPU).TypeConstraint<float>("T"), kernel<float>);   \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name(op).Device(tensorflow::DEVICE_CPU).TypeConstraint<double>("T"), kernel<double>)

TFSCALE_KERNELS("TfscaleNodeAllReduce", NodeAllReduce);
TFSCALE_KERNELS("TfscaleNodeReduceScatter", NodeReduceScatter);
TFSCALE_KERNELS("TfscaleNodeAllGather", NodeAllGather);
TFSCALE_KERNELS("TfscaleNodeAllReduceMomentum", NodeAllReduceMomentum);

}  // namespace tfscale
