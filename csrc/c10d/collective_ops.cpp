// The c10d collectives and point to point of ProcessGroupMaestro: each reads
// and checks its arguments on the caller's thread (staging CUDA tensors
// through host memory), then hands one job to the worker (enqueue()), which
// runs the collective on the engine and copies results back.
#include "c10d/backend.hpp"

#include <algorithm>
#include <future>
#include <tuple>
#include <utility>

#include "c10d/staging.hpp"
#include "c10d/tensor_args.hpp"
#include "common/error.h"

namespace maestro {
namespace c10d_glue {

using collectives::DType;
using collectives::ReduceOp;

namespace {

// The host stand-ins of a call's input and output tensor, checked as
// tensors of one kind; of its input and output lists.
std::pair<at::Tensor, at::Tensor> inOut(OpStaging& st, const at::Tensor& input, const at::Tensor& output) {
  at::Tensor in = st.in(input), out = st.out(output);
  checkTensor(in, "the input");
  checkTensor(out, "the output");
  checkSameKind(in, out, "the output");
  return {in, out};
}

std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> inOut(OpStaging& st, const std::vector<at::Tensor>& inputs,
                                                                  const std::vector<at::Tensor>& outputs) {
  return {st.in(inputs), st.out(outputs)};
}

}  // namespace

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allreduce(std::vector<at::Tensor>& tensors,
                                                                const ::c10d::AllreduceOptions& opts) {
  auto st = staging("allreduce");
  std::vector<at::Tensor> host;
  Reduction op;
  checked("allreduce", [&] {
    MAESTRO_CHECK(tensors.size() == 1, "allreduce takes exactly one tensor per process (got ", tensors.size(), ")");
    // A staged tensor the ring reduces in place is copied in and out in
    // pieces that overlap its transfer (unless it must be scaled first).
    // Only a tensor of two pieces or more: below that, a piece's launch and
    // event would cost more than the overlap gains.
    const at::Tensor& t = tensors[0];
    const uint64_t piece = staging_piece_;
    if (opts.reduceOp.op_ != ::c10d::ReduceOp::PREMUL_SUM && t.defined() && piece > 0 &&
        static_cast<uint64_t>(t.numel()) * t.element_size() >= 2 * piece)
      host = {st->inoutPipelined(t, collectives::allreduceStagingOrder(static_cast<uint64_t>(t.numel()),
                                                                       t.element_size(), getRank(), getSize(), piece))};
    else
      host = st->inout(tensors);
    checkOne(host, "allreduce");
    op = toReduction(opts.reduceOp, host[0].scalar_type());
  });
  at::Tensor tensor = host[0];
  collectives::StagedBuffer* pipeline = st->pipeline();  // lives as long as st, which outlives the job
  return enqueue(::c10d::OpType::ALLREDUCE, "maestro:all_reduce", opts.timeout, {tensors[0]}, {tensors[0]}, st,
                 [this, tensor, op, pipeline](uint64_t seq, Deadline deadline) {
                   op.prescale(tensor);
                   inPlace(tensor, [&](const collectives::Window& w) {
                     collectives::allreduce(*engine_, seq, w, tensor.numel(), toDType(tensor.scalar_type()), op.op,
                                            deadline, pipeline);
                   });
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) {
  auto st = staging("allreduce_coalesced");
  std::vector<at::Tensor> host;
  Reduction op;
  checked("allreduce_coalesced", [&] {
    host = st->inout(tensors);
    MAESTRO_CHECK(!host.empty(), "allreduce_coalesced needs at least one tensor");
    for (const auto& t : host) {
      checkTensor(t, "a tensor");
      checkSameKind(host[0], t, "a tensor");
    }
    op = toReduction(opts.reduceOp, host[0].scalar_type());
  });
  return enqueue(::c10d::OpType::ALLREDUCE_COALESCED, "maestro:all_reduce_coalesced", opts.timeout, tensors, tensors, st,
                 [this, tensors = host, op](uint64_t seq, Deadline deadline) {
                   int64_t total = 0;
                   for (const auto& t : tensors) total += t.numel();
                   Staged packed = stage(total, tensors[0].options());
                   int64_t at = 0;
                   for (const auto& t : tensors) {
                     packed.tensor.narrow(0, at, t.numel()).view(t.sizes()).copy_(t);
                     at += t.numel();
                   }
                   op.prescale(packed.tensor);
                   collectives::allreduce(*engine_, seq, packed.window, total, toDType(tensors[0].scalar_type()), op.op,
                                          deadline);
                   at = 0;
                   for (const auto& t : tensors) {
                     t.copy_(packed.tensor.narrow(0, at, t.numel()).view(t.sizes()));
                     at += t.numel();
                   }
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::broadcast(std::vector<at::Tensor>& tensors,
                                                                const ::c10d::BroadcastOptions& opts) {
  auto st = staging("broadcast");
  std::vector<at::Tensor> host;
  checked("broadcast", [&] {
    host = getRank() == opts.rootRank ? st->inout(tensors) : st->out(tensors);
    checkOne(host, "broadcast");
    MAESTRO_CHECK(opts.rootTensor == 0, "broadcast: rootTensor must be 0 (one tensor per process)");
    MAESTRO_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "broadcast: root rank ", opts.rootRank,
                  " is not a rank of this group of ", getSize());
  });
  at::Tensor tensor = host[0];
  int root = static_cast<int>(opts.rootRank);
  return enqueue(::c10d::OpType::BROADCAST, "maestro:broadcast", opts.timeout, {tensors[0]}, {tensors[0]}, st,
                 [this, tensor, root](uint64_t seq, Deadline deadline) {
                   inPlace(tensor, [&](const collectives::Window& w) {
                     collectives::broadcast(*engine_, seq, w, tensor.numel(), toDType(tensor.scalar_type()), root,
                                            deadline);
                   });
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                        const ::c10d::AllgatherOptions& opts) {
  auto st = staging("all_gather_into_tensor");
  at::Tensor in, out;
  checked("all_gather_into_tensor", [&] {
    std::tie(in, out) = inOut(*st, input, output);
    MAESTRO_CHECK(output.numel() == input.numel() * getSize(), "all_gather_into_tensor: the output has ",
                  output.numel(), " elements but must have world size (", getSize(), ") x input (", input.numel(),
                  ") = ", input.numel() * getSize());
  });
  return enqueue(::c10d::OpType::_ALLGATHER_BASE, "maestro:all_gather_into_tensor", opts.timeout, {output}, {input}, st,
                 [this, out, in](uint64_t seq, Deadline deadline) {
                   at::Tensor src = in.contiguous();  // read locally, never registered
                   if (out.is_contiguous()) {
                     Pinned pin(this, out);
                     collectives::allgather(*engine_, seq, src.data_ptr(), pin.window, src.numel(),
                                            toDType(src.scalar_type()), deadline);
                     return;
                   }
                   Staged work = stage(out.numel(), out.options());
                   collectives::allgather(*engine_, seq, src.data_ptr(), work.window, src.numel(),
                                          toDType(src.scalar_type()), deadline);
                   out.copy_(work.tensor.view(out.sizes()));
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                                std::vector<at::Tensor>& inputs,
                                                                const ::c10d::AllgatherOptions& opts) {
  auto st = staging("allgather");
  std::vector<at::Tensor> ins, outs;
  checked("allgather", [&] {
    ins = st->in(inputs);
    checkOne(ins, "allgather");
    MAESTRO_CHECK(outputs.size() == 1, "allgather takes one output list per process (got ", outputs.size(), ")");
    outs = st->out(outputs[0]);
    checkList(outs, ins[0], getSize(), "allgather", "output");
  });
  at::Tensor in = ins[0];
  return enqueue(::c10d::OpType::ALLGATHER, "maestro:all_gather", opts.timeout, outputs[0], {inputs[0]}, st,
                 [this, outs, in](uint64_t seq, Deadline deadline) {
                   // Gather into one flat tensor (written in place by the
                   // peers), then copy into the caller's list.
                   Staged flat = stage(static_cast<int64_t>(outs.size()) * in.numel(), in.options());
                   at::Tensor src = in.contiguous();
                   collectives::allgather(*engine_, seq, src.data_ptr(), flat.window, src.numel(),
                                          toDType(src.scalar_type()), deadline);
                   for (size_t i = 0; i < outs.size(); ++i)
                     outs[i].copy_(
                         flat.tensor.narrow(0, static_cast<int64_t>(i) * in.numel(), in.numel()).view(outs[i].sizes()));
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                            const ::c10d::ReduceScatterOptions& opts) {
  auto st = staging("reduce_scatter_tensor");
  at::Tensor in, out;
  Reduction op;
  checked("reduce_scatter_tensor", [&] {
    std::tie(in, out) = inOut(*st, input, output);
    MAESTRO_CHECK(input.numel() == output.numel() * getSize(), "reduce_scatter_tensor: the input has ", input.numel(),
                  " elements but must have world size (", getSize(), ") x output (", output.numel(),
                  ") = ", output.numel() * getSize());
    op = toReduction(opts.reduceOp, input.scalar_type());
  });
  return enqueue(::c10d::OpType::_REDUCE_SCATTER_BASE, "maestro:reduce_scatter_tensor", opts.timeout, {output}, {input}, st,
                 [this, out, in, op](uint64_t seq, Deadline deadline) {
                   at::Tensor src = op.source(in);
                   at::Tensor dst = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
                   collectives::reduceScatter(*engine_, seq, src.data_ptr(), dst.data_ptr(), dst.numel(),
                                              toDType(src.scalar_type()), op.op, deadline);
                   if (!dst.is_same(out)) out.copy_(dst);
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                                     const ::c10d::ReduceScatterOptions& opts) {
  auto st = staging("reduce_scatter");
  std::vector<at::Tensor> houts, ins;
  Reduction op;
  checked("reduce_scatter", [&] {
    houts = st->out(outputs);
    checkOne(houts, "reduce_scatter");
    MAESTRO_CHECK(inputs.size() == 1, "reduce_scatter takes one input list per process (got ", inputs.size(), ")");
    ins = st->in(inputs[0]);
    checkList(ins, houts[0], getSize(), "reduce_scatter", "input", true, "the output");
    op = toReduction(opts.reduceOp, houts[0].scalar_type());
  });
  at::Tensor out = houts[0];
  return enqueue(::c10d::OpType::REDUCE_SCATTER, "maestro:reduce_scatter", opts.timeout, {outputs[0]}, inputs[0], st,
                 [this, out, ins, op](uint64_t seq, Deadline deadline) {
                   std::vector<at::Tensor> flat;
                   for (const auto& t : ins) flat.push_back(t.reshape({-1}));
                   at::Tensor src = at::cat(flat);
                   op.prescale(src);
                   at::Tensor dst = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
                   collectives::reduceScatter(*engine_, seq, src.data_ptr(), dst.data_ptr(), dst.numel(),
                                              toDType(src.scalar_type()), op.op, deadline);
                   if (!dst.is_same(out)) out.copy_(dst);
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::barrier(const ::c10d::BarrierOptions& opts) {
  return enqueue(::c10d::OpType::BARRIER, "maestro:barrier", opts.timeout, {}, {}, nullptr,
                 [this](uint64_t seq, Deadline deadline) { collectives::barrier(*engine_, seq, deadline); });
}

// ---------------------------------------------------------------- coalesced

void ProcessGroupMaestro::allgatherPacked(uint64_t seq, Deadline deadline, const std::vector<at::Tensor>& inputs,
                                          const std::function<void(size_t, int, const at::Tensor&)>& place) {
  std::vector<at::Tensor> flat;
  for (const auto& t : inputs) flat.push_back(t.reshape({-1}));
  at::Tensor src = at::cat(flat);  // read locally, never registered
  const int64_t total = src.numel();
  Staged all = stage(total * getSize(), src.options());
  collectives::allgather(*engine_, seq, src.data_ptr(), all.window, total, toDType(src.scalar_type()), deadline);
  for (int r = 0; r < getSize(); ++r) {
    int64_t at = r * total;
    for (size_t i = 0; i < inputs.size(); ++i) {
      place(i, r, all.tensor.narrow(0, at, inputs[i].numel()));
      at += inputs[i].numel();
    }
  }
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const ::c10d::AllgatherOptions& opts) {
  auto st = staging("allgather_coalesced");
  std::vector<std::vector<at::Tensor>> outs;
  std::vector<at::Tensor> ins;
  checked("allgather_coalesced", [&] {
    ins = st->in(inputs);
    for (const auto& l : outputLists) outs.push_back(st->out(l));
    // torch's layout (as gloo's): outputLists[r][i] receives rank r's input i.
    checkCoalesced(ins, nullptr, 1, 1, "allgather_coalesced");
    MAESTRO_CHECK(static_cast<int>(outputLists.size()) == getSize(), "allgather_coalesced: ", outputLists.size(),
                  " output lists but the group has ", getSize(), " ranks (one list per rank)");
    for (size_t r = 0; r < outputLists.size(); ++r) {
      MAESTRO_CHECK(outputLists[r].size() == inputs.size(), "allgather_coalesced: output list ", r, " has ",
                    outputLists[r].size(), " tensors but there are ", inputs.size(), " inputs");
      for (size_t i = 0; i < inputs.size(); ++i) {
        checkTensor(outs[r][i], "an output tensor");
        checkSameKind(ins[i], outs[r][i], "an output tensor");
        MAESTRO_CHECK(outputLists[r][i].numel() == inputs[i].numel(), "allgather_coalesced: output ", r, "/", i,
                      " has ", outputLists[r][i].numel(), " elements but input ", i, " has ", inputs[i].numel());
      }
    }
  });
  std::vector<at::Tensor> all_outs;
  for (const auto& l : outputLists) all_outs.insert(all_outs.end(), l.begin(), l.end());
  return enqueue(::c10d::OpType::ALLGATHER_COALESCED, "maestro:all_gather_coalesced", opts.timeout, all_outs, inputs, st,
                 [this, outs, ins](uint64_t seq, Deadline deadline) {
                   allgatherPacked(seq, deadline, ins, [&](size_t i, int r, const at::Tensor& block) {
                     outs[r][i].copy_(block.view(outs[r][i].sizes()));
                   });
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                  std::vector<at::Tensor>& inputs,
                                                                                  const ::c10d::AllgatherOptions& opts) {
  auto st = staging("all_gather_into_tensor_coalesced");
  std::vector<at::Tensor> outs, ins;
  checked("all_gather_into_tensor_coalesced", [&] {
    std::tie(ins, outs) = inOut(*st, inputs, outputs);
    checkCoalesced(ins, &outs, getSize(), 1, "all_gather_into_tensor_coalesced");
  });
  return enqueue(kAllgatherIntoTensorCoalesced, "maestro:all_gather_into_tensor_coalesced", opts.timeout, outputs, inputs, st,
                 [this, outs, ins](uint64_t seq, Deadline deadline) {
                   std::vector<at::Tensor> flat;  // contiguous, viewed flat
                   for (const auto& o : outs)
                     flat.push_back(o.is_contiguous() ? o.view({-1}) : at::empty({o.numel()}, o.options()));
                   allgatherPacked(seq, deadline, ins, [&](size_t i, int r, const at::Tensor& block) {
                     const int64_t m = ins[i].numel();
                     flat[i].narrow(0, r * m, m).copy_(block);  // rank r's block of output i
                   });
                   for (size_t i = 0; i < outs.size(); ++i)
                     if (!outs[i].is_contiguous()) outs[i].copy_(flat[i].view(outs[i].sizes()));
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const ::c10d::ReduceScatterOptions& opts) {
  auto st = staging("reduce_scatter_tensor_coalesced");
  std::vector<at::Tensor> outs, ins;
  Reduction op;
  checked("reduce_scatter_tensor_coalesced", [&] {
    std::tie(ins, outs) = inOut(*st, inputs, outputs);
    checkCoalesced(ins, &outs, 1, getSize(), "reduce_scatter_tensor_coalesced");
    op = toReduction(opts.reduceOp, ins[0].scalar_type());
  });
  return enqueue(kReduceScatterTensorCoalesced, "maestro:reduce_scatter_tensor_coalesced", opts.timeout, outputs, inputs, st,
                 [this, outs, ins, op](uint64_t seq, Deadline deadline) {
                   // Rank r's block: block r of every input, one after another.
                   std::vector<at::Tensor> parts;
                   int64_t total = 0;
                   for (const auto& o : outs) total += o.numel();
                   for (int r = 0; r < getSize(); ++r)
                     for (size_t i = 0; i < ins.size(); ++i) {
                       const int64_t m = outs[i].numel();
                       parts.push_back(ins[i].reshape({-1}).narrow(0, r * m, m));
                     }
                   at::Tensor src = at::cat(parts);
                   op.prescale(src);
                   at::Tensor dst = at::empty({total}, src.options());
                   collectives::reduceScatter(*engine_, seq, src.data_ptr(), dst.data_ptr(), total,
                                              toDType(src.scalar_type()), op.op, deadline);
                   int64_t at = 0;
                   for (const auto& o : outs) {
                     o.copy_(dst.narrow(0, at, o.numel()).view(o.sizes()));
                     at += o.numel();
                   }
                 });
}

// Reduce, gather, scatter, all-to-all: the root (or every rank) learns the
// peers' buffers in the operation's handshake (collectives/op.h), and the
// data is written one-sided straight between the callers' tensors.

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::reduce(std::vector<at::Tensor>& tensors,
                                                             const ::c10d::ReduceOptions& opts) {
  auto st = staging("reduce");
  std::vector<at::Tensor> host;
  Reduction op;
  checked("reduce", [&] {
    // Only the root's tensor takes the result.
    host = getRank() == opts.rootRank ? st->inout(tensors) : st->in(tensors);
    checkOne(host, "reduce");
    MAESTRO_CHECK(opts.rootTensor == 0, "reduce: rootTensor must be 0 (one tensor per process)");
    checkRoot(opts.rootRank, getSize(), "reduce");
    op = toReduction(opts.reduceOp, host[0].scalar_type());
  });
  at::Tensor tensor = host[0];
  int root = static_cast<int>(opts.rootRank);
  return enqueue(::c10d::OpType::REDUCE, "maestro:reduce", opts.timeout, {tensors[0]}, {tensors[0]}, st,
                 [this, tensor, op, root](uint64_t seq, Deadline deadline) {
                   auto run = [&](const collectives::Window& w) {
                     collectives::reduce(*engine_, seq, w, tensor.numel(), toDType(tensor.scalar_type()), op.op, root,
                                         deadline);
                   };
                   if (!op.premul) return inPlace(tensor, run);
                   // PREMUL_SUM: a scaled copy is reduced, so the other ranks'
                   // tensors stay as they were; the root takes the result.
                   Staged work = stage(tensor.numel(), tensor.options());
                   work.tensor.view(tensor.sizes()).copy_(tensor);
                   op.prescale(work.tensor);
                   run(work.window);
                   if (getRank() == root) tensor.copy_(work.tensor.view(tensor.sizes()));
                 });
}

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
  const char* name = gathers ? "gather" : "scatter";
  const int root = static_cast<int>(root_rank);
  auto st = staging(name);
  // The rank's own tensor is read (gather) or written (scatter); the root's
  // list the other way round. Elsewhere torch passes no list.
  auto stageOne = [&](std::vector<at::Tensor>& v) { return gathers ? st->in(v) : st->out(v); };
  auto stageList = [&](std::vector<at::Tensor>& v) { return gathers ? st->out(v) : st->in(v); };
  std::vector<at::Tensor> one, list;
  checked(name, [&] {
    one = stageOne(ones);
    checkOne(one, name);
    list = rootList(lists, root_rank, getRank(), getSize(), one[0], gathers ? "the input" : "the output", name,
                    gathers ? "output" : "input", stageList);
  });
  const at::Tensor t = one[0];
  const std::vector<at::Tensor> root_side = getRank() == root ? lists[0] : std::vector<at::Tensor>{};
  return enqueue(gathers ? ::c10d::OpType::GATHER : ::c10d::OpType::SCATTER,
                 gathers ? "maestro:gather" : "maestro:scatter", timeout, gathers ? root_side : ones,
                 gathers ? ones : root_side, st, [this, t, list, root, gathers](uint64_t seq, Deadline deadline) {
                   PinnedList mine(this, {t}, gathers), theirs(this, list, !gathers);
                   const DType dtype = toDType(t.scalar_type());
                   if (gathers) {
                     collectives::gather(*engine_, seq, mine.windows[0], theirs.windows, t.numel(), dtype, root,
                                         deadline);
                     theirs.copyBack();
                   } else {
                     collectives::scatter(*engine_, seq, theirs.windows, mine.windows[0], t.numel(), dtype, root,
                                          deadline);
                     mine.copyBack();
                   }
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::alltoall(std::vector<at::Tensor>& outputs,
                                                               std::vector<at::Tensor>& inputs,
                                                               const ::c10d::AllToAllOptions& opts) {
  auto st = staging("all_to_all");
  std::vector<at::Tensor> outs, ins;
  checked("all_to_all", [&] {
    std::tie(ins, outs) = inOut(*st, inputs, outputs);
    MAESTRO_CHECK(!ins.empty(), "all_to_all: the input list is empty");
    checkList(ins, ins[0], getSize(), "all_to_all", "input", false);
    checkList(outs, ins[0], getSize(), "all_to_all", "output", false);
    checkToItself(ins[getRank()].numel(), outs[getRank()].numel(), "all_to_all");
  });
  return enqueue(::c10d::OpType::ALLTOALL, "maestro:all_to_all", opts.timeout, outputs, inputs, st,
                 [this, outs, ins](uint64_t seq, Deadline deadline) {
                   std::vector<at::Tensor> sources;
                   for (const auto& t : ins) {
                     // An input that shares memory with an output is read
                     // from a copy: the peers' writes must not overwrite it.
                     bool aliased = false;
                     for (const auto& o : outs) aliased = aliased || (t.numel() && o.numel() && t.is_alias_of(o));
                     sources.push_back(aliased ? t.clone() : t);
                   }
                   PinnedList src(this, sources, true), dst(this, outs, false);
                   std::vector<uint64_t> sends, recvs;
                   for (const auto& t : ins) sends.push_back(t.numel());
                   for (const auto& t : outs) recvs.push_back(t.numel());
                   collectives::alltoall(*engine_, seq, src.windows, sends, dst.windows, recvs,
                                         toDType(ins[0].scalar_type()), deadline);
                   dst.copyBack();
                 });
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                        std::vector<int64_t>& outputSplitSizes,
                                                                        std::vector<int64_t>& inputSplitSizes,
                                                                        const ::c10d::AllToAllOptions& opts) {
  auto st = staging("all_to_all_single");
  std::vector<uint64_t> sends, recvs;
  at::Tensor in, out;
  checked("all_to_all_single", [&] {
    std::tie(in, out) = inOut(*st, input, output);
    sends = splitCounts(inputSplitSizes, input, getSize(), "input");
    recvs = splitCounts(outputSplitSizes, output, getSize(), "output");
    checkToItself(sends[getRank()], recvs[getRank()], "all_to_all_single");
  });
  return enqueue(::c10d::OpType::ALLTOALL_BASE, "maestro:all_to_all_single", opts.timeout, {output}, {input}, st,
                 [this, out, in, sends, recvs](uint64_t seq, Deadline deadline) {
                   at::Tensor source = in.numel() && out.numel() && in.is_alias_of(out) ? in.clone() : in;
                   PinnedList src(this, {source}, true), dst(this, {out}, false);
                   // Every rank's block is a window at its offset in the one
                   // tensor: read and written in place.
                   const uint64_t elem = in.element_size();
                   std::vector<collectives::Window> ins, outs;
                   uint64_t at_in = 0, at_out = 0;
                   for (int p = 0; p < getSize(); ++p) {
                     ins.push_back(collectives::Window{src.windows[0].region, src.windows[0].base + at_in * elem});
                     outs.push_back(collectives::Window{dst.windows[0].region, dst.windows[0].base + at_out * elem});
                     at_in += sends[p];
                     at_out += recvs[p];
                   }
                   collectives::alltoall(*engine_, seq, ins, sends, outs, recvs, toDType(in.scalar_type()), deadline);
                   dst.copyBack();
                 });
}

// ---------------------------------------------------------------- point to point

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return pointToPoint(true, tensors, dstRank, tag);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  MAESTRO_CHECK(srcRank >= 0, "recv: source rank ", srcRank, " is not a rank of this group of ", getSize());
  return pointToPoint(false, tensors, srcRank, tag);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return pointToPoint(false, tensors, -1, tag);
}

c10::intrusive_ptr<::c10d::Work> ProcessGroupMaestro::pointToPoint(bool send, std::vector<at::Tensor>& tensors,
                                                                   int peer, int tag) {
  const char* name = send ? "send" : "recv";
  // Only this rank and its peer are involved: a bad argument raises here and
  // leaves the group as it was (the peer's matching call times out).
  auto st = staging(name);
  std::vector<at::Tensor> host = send ? st->in(tensors) : st->out(tensors);
  checkOne(host, name);
  MAESTRO_CHECK(static_cast<uint32_t>(tag) - kReservedTagBase >= kReservedTags, name, ": tag ", tag,
                " is reserved by maestro (tags from ", static_cast<int32_t>(kReservedTagBase), " to ",
                static_cast<int32_t>(kReservedTagBase + kReservedTags - 1), ")");
  {
    std::lock_guard<std::mutex> lock(mu_);
    MAESTRO_CHECK(!stopping_ && engine_, "maestro ", name, ": the process group was shut down");
  }
  at::Tensor tensor = host[0];
  // Zero copy where the layout allows: the peer writes straight into a
  // contiguous recv tensor, a send is read straight from a contiguous one.
  at::Tensor buffer = tensor.is_contiguous() ? tensor : (send ? tensor.contiguous() : at::empty_like(tensor, at::MemoryFormat::Contiguous));
  auto work = c10::make_intrusive<MaestroWork>(getRank(), send ? ::c10d::OpType::SEND : (peer < 0 ? ::c10d::OpType::RECVANYSOURCE : ::c10d::OpType::RECV),
                                               0, send ? "maestro:send" : (peer < 0 ? "maestro:recvAnySource" : "maestro:recv"),
                                               send ? std::vector<at::Tensor>{} : std::vector<at::Tensor>{tensors[0]},
                                               std::vector<at::Tensor>{tensors[0]}, st->devices());
  if (st->active()) {
    work->setCopies(st->copies());
    st->called();
    st->copyIn();  // a send's bytes are in its stand-in before it is posted (this call waits for that copy)
  }
  auto pin = std::make_shared<Pinned>(this, buffer);
  const uint64_t bytes = buffer.numel() * buffer.element_size();
  collectives::PointToPoint::Done done = [work, pin, tensor, buffer, send, st](std::exception_ptr error,
                                                                                 int source) mutable {
    if (!error && !send) {
      try {
        if (!buffer.is_same(tensor)) tensor.copy_(buffer);
        st->copyOut();
      } catch (const std::exception&) {
        error = std::current_exception();
      }
    }
    pin.reset();  // unpinned before the Work completes: the caller may free the tensor then
    if (!send) work->setSource(source);
    work->complete(error);
    st->finish();
  };
  const Deadline deadline = deadlineAfter(timeout_.load());
  if (send) p2p_->send(peer, static_cast<uint32_t>(tag), pin->window, bytes, deadline, std::move(done));
  else p2p_->recv(peer, static_cast<uint32_t>(tag), pin->window, bytes, deadline, std::move(done));
  return work;
}

// ---------------------------------------------------------------- monitored barrier

void ProcessGroupMaestro::monitoredBarrier(const ::c10d::BarrierOptions& opts, bool waitAllRanks) {
  const int n = getSize(), me = getRank();
  const auto timeout = opts.timeout == ::c10d::kUnsetTimeout ? timeout_.load() : opts.timeout;
  const Deadline deadline = deadlineAfter(timeout);
  // Every rank calls it the same number of times: the count names the
  // barrier, so a late token of an earlier one never matches a later one.
  const uint32_t tag = kReservedTagBase + monitored_barriers_.fetch_add(1) % kReservedTags;
  {
    std::lock_guard<std::mutex> lock(mu_);
    MAESTRO_CHECK(!stopping_ && engine_, "maestro monitored_barrier: the process group was shut down");
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
    token->pin = std::make_shared<Pinned>(this, t);
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
