// The c10d operations of ProcessGroupMaestro, each declared once: its entry
// in the op table (op_pipeline.hpp) and, here, what is its own -- its checks,
// which read its tensors through the call's staging, and its run on the
// worker, on the memory strategies it chooses (op_memory.hpp). The op
// pipeline (op_pipeline.cpp) does the rest: rejection on every rank,
// sequence numbers, the Work, the staging's copies and the copies back.
#include "c10d/backend.hpp"

#include <algorithm>
#include <future>
#include <utility>

#include "c10d/op_pipeline.hpp"
#include "c10d/staging.hpp"
#include "c10d/tensor_args.hpp"
#include "common/error.h"

namespace maestro {
namespace c10d_glue {

using collectives::DType;
using collectives::ReduceOp;

namespace {

constexpr auto kRead = OpMemory::kRead;
constexpr auto kWrite = OpMemory::kWrite;
constexpr auto kReadWrite = OpMemory::kReadWrite;

// The host stand-ins of a call's input and output tensor, checked as
// tensors of one kind; of its input and output lists.
struct InOut {
  at::Tensor in, out;
};
struct InOuts {
  std::vector<at::Tensor> ins, outs;
};

InOut inOut(OpStaging& st, const at::Tensor& input, const at::Tensor& output) {
  InOut io{st.in(input), st.out(output)};
  checkTensor(io.in, "the input");
  checkTensor(io.out, "the output");
  checkSameKind(io.in, io.out, "the output");
  return io;
}

InOuts inOut(OpStaging& st, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) {
  return {st.in(inputs), st.out(outputs)};
}

// An all-gather's input and output list (`gathers`), a reduce-scatter's
// output and input list: this rank's tensor and a list of one tensor per
// rank like it.
struct OneAndList {
  at::Tensor one;
  std::vector<at::Tensor> list;
};

OneAndList oneAndList(OpStaging& st, std::vector<at::Tensor>& ones, std::vector<std::vector<at::Tensor>>& lists,
                      bool gathers, int size, const char* name) {
  const char* what = gathers ? "output" : "input";
  const std::vector<at::Tensor> one = gathers ? st.in(ones) : st.out(ones);
  checkOne(one, name);
  MAESTRO_CHECK(lists.size() == 1, name, " takes one ", what, " list per process (got ", lists.size(), ")");
  std::vector<at::Tensor> list = gathers ? st.out(lists[0]) : st.in(lists[0]);
  checkList(list, one[0], size, name, what, true, gathers ? "the input" : "the output");
  return {one[0], list};
}

// The blocks rank q of `size` contributes to (or receives of) every tensor
// of `whole`, one after another, rank by rank: block q of tensor i holds
// counts[i] elements of it.
std::vector<at::Tensor> blocksByRank(const std::vector<at::Tensor>& whole, const std::vector<at::Tensor>& counts,
                                     int size) {
  std::vector<at::Tensor> blocks;
  for (int q = 0; q < size; ++q)
    for (size_t i = 0; i < whole.size(); ++i) {
      const int64_t m = counts[i].numel();
      blocks.push_back(whole[i].reshape({-1}).narrow(0, q * m, m));
    }
  return blocks;
}

}  // namespace

// ---------------------------------------------------------------- reductions and broadcast

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allreduce(std::vector<at::Tensor>& tensors,
                                                                const ::c10d::AllreduceOptions& opts) {
  return collective(ops::kAllReduce, opts.timeout, [&](OpStaging& st, const char* name) -> Call {
    MAESTRO_CHECK(tensors.size() == 1, name, " takes exactly one tensor per process (got ", tensors.size(), ")");
    // A staged tensor the ring reduces in place is copied in and out in
    // pieces that overlap its transfer (unless it must be scaled first).
    // Only a tensor of two pieces or more: below that, a piece's launch and
    // event would cost more than the overlap gains.
    const at::Tensor& t = tensors[0];
    const uint64_t piece = staging_piece_;
    std::vector<at::Tensor> host;
    if (opts.reduceOp.op_ != ::c10d::ReduceOp::PREMUL_SUM && t.defined() && piece > 0 &&
        static_cast<uint64_t>(t.numel()) * t.element_size() >= 2 * piece)
      host = {st.inoutPipelined(t, collectives::allreduceStagingOrder(static_cast<uint64_t>(t.numel()),
                                                                      t.element_size(), getRank(), getSize(), piece))};
    else
      host = st.inout(tensors);
    checkOne(host, name);
    const Reduction op = toReduction(opts.reduceOp, host[0].scalar_type());
    const at::Tensor tensor = host[0];
    collectives::StagedBuffer* pipeline = st.pipeline();  // lives as long as the staging, which outlives the run
    return {{tensors[0]}, {tensors[0]}, [this, tensor, op, pipeline](const OpRun& r) {
              op.prescale(tensor);
              collectives::allreduce(*engine_, r.seq, r.memory.inPlace(tensor, kReadWrite), tensor.numel(),
                                     toDType(tensor.scalar_type()), op.op, r.deadline, pipeline);
            }};
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  return collective(ops::kAllReduceCoalesced, opts.timeout, [&](OpStaging& st, const char* name) -> Call {
    std::vector<at::Tensor> host = st.inout(tensors);
    MAESTRO_CHECK(!host.empty(), name, " needs at least one tensor");
    for (const auto& t : host) {
      checkTensor(t, "a tensor");
      checkSameKind(host[0], t, "a tensor");
    }
    const Reduction op = toReduction(opts.reduceOp, host[0].scalar_type());
    return {tensors, tensors, [this, host, op](const OpRun& r) {
              // One allreduce of the tensors packed into one block.
              OpMemory::Staged packed = r.memory.packed(host, kReadWrite);
              op.prescale(packed.tensor);
              collectives::allreduce(*engine_, r.seq, packed.window, packed.tensor.numel(),
                                     toDType(host[0].scalar_type()), op.op, r.deadline);
            }};
  });
}

// A broadcast reads the root's tensor and writes every rank's; a reduce
// reads every rank's and writes the root's.
at::Tensor ProcessGroupMaestro::rootedOne(OpStaging& st, std::vector<at::Tensor>& tensors, int64_t root,
                                          int64_t root_tensor, bool reads, bool writes, const char* name) {
  std::vector<at::Tensor> host = reads && writes ? st.inout(tensors) : (reads ? st.in(tensors) : st.out(tensors));
  checkOne(host, name);
  MAESTRO_CHECK(root_tensor == 0, name, ": rootTensor must be 0 (one tensor per process)");
  checkRoot(root, getSize(), name);
  return host[0];
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::broadcast(std::vector<at::Tensor>& tensors,
                                                                const ::c10d::BroadcastOptions& opts) {
  return collective(ops::kBroadcast, opts.timeout, [&](OpStaging& st, const char* name) -> Call {
    const bool is_root = getRank() == opts.rootRank;
    const at::Tensor tensor = rootedOne(st, tensors, opts.rootRank, opts.rootTensor, is_root, true, name);
    return {{tensors[0]}, {tensors[0]}, [this, tensor, root = static_cast<int>(opts.rootRank)](const OpRun& r) {
              collectives::broadcast(*engine_, r.seq, r.memory.inPlace(tensor, kReadWrite), tensor.numel(),
                                     toDType(tensor.scalar_type()), root, r.deadline);
            }};
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::reduce(std::vector<at::Tensor>& tensors,
                                                             const ::c10d::ReduceOptions& opts) {
  return collective(ops::kReduce, opts.timeout, [&](OpStaging& st, const char* name) -> Call {
    // Only the root's tensor takes the result.
    const bool is_root = getRank() == opts.rootRank;
    const at::Tensor tensor = rootedOne(st, tensors, opts.rootRank, opts.rootTensor, true, is_root, name);
    const Reduction op = toReduction(opts.reduceOp, tensor.scalar_type());
    return {{tensors[0]}, {tensors[0]}, [this, tensor, op, is_root, root = static_cast<int>(opts.rootRank)](
                                            const OpRun& r) {
              collectives::Window w;
              if (!op.premul) {
                w = r.memory.inPlace(tensor, kReadWrite);
              } else {
                // PREMUL_SUM: a scaled copy is reduced, so the other ranks'
                // tensors stay as they were; the root takes the result.
                OpMemory::Staged copy = r.memory.packed({tensor}, is_root ? kReadWrite : kRead);
                op.prescale(copy.tensor);
                w = copy.window;
              }
              collectives::reduce(*engine_, r.seq, w, tensor.numel(), toDType(tensor.scalar_type()), op.op, root,
                                  r.deadline);
            }};
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::barrier(const ::c10d::BarrierOptions& opts) {
  return collective(ops::kBarrier, opts.timeout, [this](OpStaging&, const char*) -> Call {
    return {{}, {}, [this](const OpRun& r) { collectives::barrier(*engine_, r.seq, r.deadline); }};
  });
}

// ---------------------------------------------------------------- gathers and scatters of blocks

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                        const ::c10d::AllgatherOptions& opts) {
  return collective(ops::kAllGatherIntoTensor, opts.timeout, [&](OpStaging& st, const char* name) -> Call {
    const InOut io = inOut(st, input, output);
    checkWorldTimes(output, "output", input, "input", getSize(), name);
    return {{output}, {input}, [this, io](const OpRun& r) {
              const at::Tensor src = io.in.contiguous();  // read locally, never registered
              collectives::allgather(*engine_, r.seq, src.data_ptr(), r.memory.inPlace(io.out, kWrite), src.numel(),
                                     toDType(src.scalar_type()), r.deadline);
            }};
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const ::c10d::AllgatherOptions& opts) {
  return collective(ops::kAllGather, opts.timeout, [&](OpStaging& st, const char* name) -> Call {
    const OneAndList io = oneAndList(st, inputs, outputs, true, getSize(), name);
    return {outputs[0], {inputs[0]}, [this, outs = io.list, in = io.one](const OpRun& r) {
              // Gathered into one block (written in place by the peers),
              // which the copy back spreads over the caller's list.
              OpMemory::Staged flat = r.memory.packed(outs, kWrite);
              const at::Tensor src = in.contiguous();
              collectives::allgather(*engine_, r.seq, src.data_ptr(), flat.window, src.numel(),
                                     toDType(src.scalar_type()), r.deadline);
            }};
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                            const ::c10d::ReduceScatterOptions& opts) {
  return collective(ops::kReduceScatterTensor, opts.timeout, [&](OpStaging& st, const char* name) -> Call {
    const InOut io = inOut(st, input, output);
    checkWorldTimes(input, "input", output, "output", getSize(), name);
    const Reduction op = toReduction(opts.reduceOp, input.scalar_type());
    return {{output}, {input}, [this, io, op](const OpRun& r) {
              const at::Tensor src = op.source(io.in);
              const at::Tensor dst = r.memory.contiguous(io.out, kWrite);
              collectives::reduceScatter(*engine_, r.seq, src.data_ptr(), dst.data_ptr(), dst.numel(),
                                         toDType(src.scalar_type()), op.op, r.deadline);
            }};
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                                     const ::c10d::ReduceScatterOptions& opts) {
  return collective(ops::kReduceScatter, opts.timeout, [&](OpStaging& st, const char* name) -> Call {
    const OneAndList io = oneAndList(st, outputs, inputs, false, getSize(), name);
    const Reduction op = toReduction(opts.reduceOp, io.one.scalar_type());
    return {{outputs[0]}, inputs[0], [this, out = io.one, ins = io.list, op](const OpRun& r) {
              at::Tensor src = r.memory.packedLocal(ins, kRead);
              op.prescale(src);
              const at::Tensor dst = r.memory.contiguous(out, kWrite);
              collectives::reduceScatter(*engine_, r.seq, src.data_ptr(), dst.data_ptr(), dst.numel(),
                                         toDType(src.scalar_type()), op.op, r.deadline);
            }};
  });
}

// ---------------------------------------------------------------- coalesced

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  return collective(ops::kAllGatherCoalesced, opts.timeout, [&](OpStaging& st, const char* name) -> Call {
    std::vector<at::Tensor> ins = st.in(inputs);
    std::vector<std::vector<at::Tensor>> outs;
    for (const auto& l : outputLists) outs.push_back(st.out(l));
    // torch's layout (as gloo's): outputLists[r][i] receives rank r's input i.
    checkCoalesced(ins, nullptr, 1, 1, name);
    MAESTRO_CHECK(static_cast<int>(outputLists.size()) == getSize(), name, ": ", outputLists.size(),
                  " output lists but the group has ", getSize(), " ranks (one list per rank)");
    for (size_t r = 0; r < outputLists.size(); ++r) {
      MAESTRO_CHECK(outputLists[r].size() == inputs.size(), name, ": output list ", r, " has ",
                    outputLists[r].size(), " tensors but there are ", inputs.size(), " inputs");
      for (size_t i = 0; i < inputs.size(); ++i) {
        checkTensor(outs[r][i], "an output tensor");
        checkSameKind(ins[i], outs[r][i], "an output tensor");
        MAESTRO_CHECK(outputLists[r][i].numel() == inputs[i].numel(), name, ": output ", r, "/", i, " has ",
                      outputLists[r][i].numel(), " elements but input ", i, " has ", inputs[i].numel());
      }
    }
    // Rank by rank, input by input: as the allgather lays the blocks out.
    std::vector<at::Tensor> all_outs, blocks;
    for (const auto& l : outputLists) all_outs.insert(all_outs.end(), l.begin(), l.end());
    for (const auto& l : outs) blocks.insert(blocks.end(), l.begin(), l.end());
    return {all_outs, inputs, [this, ins, blocks](const OpRun& r) { allgatherBlocks(r, ins, blocks); }};
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                  std::vector<at::Tensor>& inputs,
                                                                                  const ::c10d::AllgatherOptions& opts) {
  return collective(ops::kAllGatherIntoTensorCoalesced, opts.timeout, [&](OpStaging& st, const char* name) -> Call {
    const InOuts io = inOut(st, inputs, outputs);
    checkCoalesced(io.ins, &io.outs, getSize(), 1, name);
    return {outputs, inputs, [this, io](const OpRun& r) {
              // Input i of rank q lands in block q of output i.
              std::vector<at::Tensor> flat;
              for (const auto& o : io.outs) flat.push_back(r.memory.contiguous(o, kWrite));
              allgatherBlocks(r, io.ins, blocksByRank(flat, io.ins, getSize()));
            }};
  });
}

void ProcessGroupMaestro::allgatherBlocks(const OpRun& r, const std::vector<at::Tensor>& inputs,
                                          const std::vector<at::Tensor>& blocks) {
  const at::Tensor src = r.memory.packedLocal(inputs, kRead);  // read locally, never registered
  OpMemory::Staged all = r.memory.packed(blocks, kWrite);
  collectives::allgather(*engine_, r.seq, src.data_ptr(), all.window, src.numel(), toDType(src.scalar_type()),
                         r.deadline);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const ::c10d::ReduceScatterOptions& opts) {
  return collective(ops::kReduceScatterTensorCoalesced, opts.timeout, [&](OpStaging& st, const char* name) -> Call {
    const InOuts io = inOut(st, inputs, outputs);
    checkCoalesced(io.ins, &io.outs, 1, getSize(), name);
    const Reduction op = toReduction(opts.reduceOp, io.ins[0].scalar_type());
    return {outputs, inputs, [this, io, op](const OpRun& r) {
              // Rank q's block: block q of every input, one after another.
              at::Tensor src = r.memory.packedLocal(blocksByRank(io.ins, io.outs, getSize()), kRead);
              op.prescale(src);
              const at::Tensor dst = r.memory.packedLocal(io.outs, kWrite);
              collectives::reduceScatter(*engine_, r.seq, src.data_ptr(), dst.data_ptr(), dst.numel(),
                                         toDType(src.scalar_type()), op.op, r.deadline);
            }};
  });
}

// ---------------------------------------------------------------- rooted and all-to-all

// Reduce, gather, scatter, all-to-all: the root (or every rank) learns the
// peers' buffers in the operation's handshake (collectives/op.h), and the
// data is written one-sided straight between the callers' tensors.

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const ::c10d::GatherOptions& opts) {
  return rooted(true, inputs, outputs, opts.rootRank, opts.timeout);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::scatter(std::vector<at::Tensor>& outputs,
                                                              std::vector<std::vector<at::Tensor>>& inputs,
                                                              const ::c10d::ScatterOptions& opts) {
  return rooted(false, outputs, inputs, opts.rootRank, opts.timeout);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::rooted(bool gathers, std::vector<at::Tensor>& ones,
                                                             std::vector<std::vector<at::Tensor>>& lists,
                                                             int64_t root_rank, std::chrono::milliseconds timeout) {
  return collective(gathers ? ops::kGather : ops::kScatter, timeout, [&](OpStaging& st, const char* name) -> Call {
    // The rank's own tensor is read (gather) or written (scatter); the
    // root's list the other way round. Elsewhere torch passes no list.
    const std::vector<at::Tensor> one = gathers ? st.in(ones) : st.out(ones);
    checkOne(one, name);
    auto stageList = [&](std::vector<at::Tensor>& v) { return gathers ? st.out(v) : st.in(v); };
    const std::vector<at::Tensor> list = rootList(lists, root_rank, getRank(), getSize(), one[0],
                                                  gathers ? "the input" : "the output", name,
                                                  gathers ? "output" : "input", stageList);
    const int root = static_cast<int>(root_rank);
    const std::vector<at::Tensor> root_side = getRank() == root ? lists[0] : std::vector<at::Tensor>{};
    return {gathers ? root_side : ones, gathers ? ones : root_side,
            [this, t = one[0], list, root, gathers](const OpRun& r) {
              const std::vector<collectives::Window> mine = r.memory.pinned({t}, gathers ? kRead : kWrite),
                                                     theirs = r.memory.pinned(list, gathers ? kWrite : kRead);
              const DType dtype = toDType(t.scalar_type());
              if (gathers)
                collectives::gather(*engine_, r.seq, mine[0], theirs, t.numel(), dtype, root, r.deadline);
              else
                collectives::scatter(*engine_, r.seq, theirs, mine[0], t.numel(), dtype, root, r.deadline);
            }};
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::alltoall(std::vector<at::Tensor>& outputs,
                                                               std::vector<at::Tensor>& inputs,
                                                               const ::c10d::AllToAllOptions& opts) {
  return collective(ops::kAllToAll, opts.timeout, [&](OpStaging& st, const char* name) -> Call {
    const InOuts io = inOut(st, inputs, outputs);
    MAESTRO_CHECK(!io.ins.empty(), name, ": the input list is empty");
    checkList(io.ins, io.ins[0], getSize(), name, "input", false);
    checkList(io.outs, io.ins[0], getSize(), name, "output", false);
    checkToItself(io.ins[getRank()].numel(), io.outs[getRank()].numel(), name);
    return {outputs, inputs, [this, ins = io.ins, outs = io.outs](const OpRun& r) {
              std::vector<at::Tensor> sources;
              for (const auto& t : ins) {
                // An input that shares memory with an output is read from a
                // copy: the peers' writes must not overwrite it.
                bool aliased = false;
                for (const auto& o : outs) aliased = aliased || (t.numel() && o.numel() && t.is_alias_of(o));
                sources.push_back(aliased ? t.clone() : t);
              }
              const std::vector<collectives::Window> src = r.memory.pinned(sources, kRead),
                                                     dst = r.memory.pinned(outs, kWrite);
              std::vector<uint64_t> sends, recvs;
              for (const auto& t : ins) sends.push_back(t.numel());
              for (const auto& t : outs) recvs.push_back(t.numel());
              collectives::alltoall(*engine_, r.seq, src, sends, dst, recvs, toDType(ins[0].scalar_type()),
                                    r.deadline);
            }};
  });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                        std::vector<int64_t>& outputSplitSizes,
                                                                        std::vector<int64_t>& inputSplitSizes,
                                                                        const ::c10d::AllToAllOptions& opts) {
  return collective(ops::kAllToAllSingle, opts.timeout, [&](OpStaging& st, const char* name) -> Call {
    const InOut io = inOut(st, input, output);
    const std::vector<uint64_t> sends = splitCounts(inputSplitSizes, input, getSize(), "input", name),
                                recvs = splitCounts(outputSplitSizes, output, getSize(), "output", name);
    checkToItself(sends[getRank()], recvs[getRank()], name);
    return {{output}, {input}, [this, in = io.in, out = io.out, sends, recvs](const OpRun& r) {
              const at::Tensor source = in.numel() && out.numel() && in.is_alias_of(out) ? in.clone() : in;
              const collectives::Window src = r.memory.pinned({source}, kRead)[0],
                                        dst = r.memory.pinned({out}, kWrite)[0];
              // Every rank's block is a window at its offset in the one
              // tensor: read and written in place.
              const uint64_t elem = in.element_size();
              std::vector<collectives::Window> ins, outs;
              uint64_t at_in = 0, at_out = 0;
              for (int p = 0; p < getSize(); ++p) {
                ins.push_back(collectives::Window{src.region, src.base + at_in * elem});
                outs.push_back(collectives::Window{dst.region, dst.base + at_out * elem});
                at_in += sends[p];
                at_out += recvs[p];
              }
              collectives::alltoall(*engine_, r.seq, ins, sends, outs, recvs, toDType(in.scalar_type()), r.deadline);
            }};
  });
}

// ---------------------------------------------------------------- point to point

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return pointToPoint(ops::kSend, true, tensors, dstRank, tag);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  MAESTRO_CHECK(srcRank >= 0, ops::kRecv.name, ": source rank ", srcRank, " is not a rank of this group of ", getSize());
  return pointToPoint(ops::kRecv, false, tensors, srcRank, tag);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return pointToPoint(ops::kRecvAnySource, false, tensors, -1, tag);
}

// ---------------------------------------------------------------- monitored barrier

void ProcessGroupMaestro::monitoredBarrier(const ::c10d::BarrierOptions& opts, bool waitAllRanks) {
  const int n = getSize(), me = getRank();
  const auto timeout = opts.timeout == ::c10d::kUnsetTimeout ? timeout_.load() : opts.timeout;
  const Deadline deadline = deadlineAfter(timeout);
  // Every rank calls it the same number of times: the count names the
  // barrier, so a late token of an earlier one never matches a later one.
  const uint32_t tag = kReservedTagBase + monitored_barriers_.fetch_add(1) % kReservedTags;
  MemorySource source;
  {
    std::lock_guard<std::mutex> lock(mu_);
    MAESTRO_CHECK(!stopping_ && engine_, "maestro monitored_barrier: the process group was shut down");
    source = memorySource();
  }
  if (n == 1) return;
  // rank 0's answer: which ranks did not arrive (all zero: pass).
  at::Tensor missing = at::zeros({n}, at::kInt);
  struct Token {
    std::promise<std::exception_ptr> done;
    std::shared_ptr<Pinned> pin;
  };
  // Rank 0 answers once it heard from everyone or gave up on someone: up to
  // one timeout after it came, so the others wait for its answer longer.
  const Deadline answer_deadline = deadlineAfter(2 * timeout);
  auto post = [&](bool send, int peer, const at::Tensor& t, Deadline deadline) {
    auto token = std::make_shared<Token>();
    token->pin = std::make_shared<Pinned>(source, t);
    auto done = [token](std::exception_ptr error, int) {
      token->pin.reset();
      token->done.set_value(error);
    };
    const uint64_t bytes = t.numel() * t.element_size();
    if (send) p2p_->send(peer, tag, token->pin->window, bytes, deadline, done);
    else p2p_->recv(peer, tag, token->pin->window, bytes, deadline, done);
    return token->done.get_future();
  };
  const std::string ms = strcat(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count(), " ms");
  at::Tensor empty = at::empty({0}, at::kInt);
  if (me != 0) {
    auto sent = post(true, 0, empty, deadline);
    auto answer = post(false, 0, missing, answer_deadline);
    std::exception_ptr error = sent.get();
    std::exception_ptr answered = answer.get();
    if (error || answered)
      fail("maestro monitored_barrier: rank ", me, " did not hear from rank 0 within ", ms,
           " (rank 0 did not reach the barrier, or failed it: see its error)");
    std::string who;
    for (int r = 0; r < n; ++r)
      if (missing.data_ptr<int32_t>()[r]) who += strcat(who.empty() ? "" : ", ", r);
    if (!who.empty())
      fail("Rank(s) ", who, " failed to pass monitoredBarrier in ", ms, " (maestro monitored_barrier, reported by rank 0)");
    return;
  }
  std::vector<std::future<std::exception_ptr>> arrivals;
  for (int r = 1; r < n; ++r) arrivals.push_back(post(false, r, empty, deadline));
  std::vector<int> late;
  for (int r = 1; r < n; ++r)
    if (arrivals[r - 1].get()) {
      late.push_back(r);
      missing.data_ptr<int32_t>()[r] = 1;
    }
  std::vector<std::future<std::exception_ptr>> answers;
  for (int r = 1; r < n; ++r)
    if (!missing.data_ptr<int32_t>()[r]) answers.push_back(post(true, r, missing, answer_deadline));
  for (auto& a : answers) a.get();  // a rank that left after arriving is not this barrier's failure
  if (late.empty()) return;
  // gloo's wording, which torch's tests and users' log scrapers look for.
  if (timeout.count() <= 0)
    fail("Rank 0 timed out in monitoredBarrier after ", ms, " (maestro monitored_barrier: no time to wait for rank",
         late.size() > 1 ? "s" : "", " ", late[0], late.size() > 1 ? " and others" : "", ")");
  std::string who;
  for (size_t i = 0; i < (waitAllRanks ? late.size() : 1); ++i) who += strcat(i ? ", " : "", late[i]);
  fail(waitAllRanks && late.size() > 1 ? "Ranks " : "Rank ", who, " failed to pass monitoredBarrier in ", ms,
       " (maestro monitored_barrier", waitAllRanks ? "" : "; the first such rank, wait_all_ranks=True names all", ")");
}

}  // namespace c10d_glue
}  // namespace maestro
