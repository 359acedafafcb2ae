#include "multipath/reassembler.h"

#include "common/error.h"

namespace maestro {
namespace multipath {

Reassembler::Reassembler(const Chunking& chunking) : chunking_(chunking) {}

Reassembler::Message& Reassembler::at(uint32_t tag) {
  // Sized on first use: a peer this rank never talks to costs no table.
  if (messages_.empty()) messages_.resize(kUsedTags);
  return messages_[tag];
}

bool Reassembler::isSet(const Message& m, uint32_t chunk) {
  const size_t word = chunk / 64;
  return word < m.bitmap.size() && (m.bitmap[word] & (1ull << (chunk % 64))) != 0;
}

bool Reassembler::testAndSet(Message& m, uint32_t chunk) {
  if (isSet(m, chunk)) return false;
  const size_t word = chunk / 64;
  if (m.bitmap.size() <= word) m.bitmap.resize(word + 1, 0);
  m.bitmap[word] |= 1ull << (chunk % 64);
  return true;
}

std::vector<ChunkSpan> Reassembler::expect(uint32_t tag, uint64_t bytes, std::shared_ptr<ChunkHook> hook, Cut cut) {
  MAESTRO_CHECK(tag < kUsedTags, "message tag ", tag, " out of range");
  Message& m = at(tag);
  MAESTRO_CHECK(!m.expected, "message tag ", tag, " is already expected (collective schedule bug)");
  m.expected = true;
  m.bytes = bytes;
  m.chunking = cutWith(chunking_, cut);
  m.chunks = chunkCount(bytes, m.chunking);
  m.hook = std::move(hook);
  std::vector<ChunkSpan> early;
  for (const auto& e : m.early) {
    ChunkSpan span = chunkAt(bytes, m.chunking, e.first);
    MAESTRO_CHECK(e.first < m.chunks && span.length == e.second, "chunk ", e.first, " of message ", tag,
                  " arrived with ", e.second, " bytes, but the message has ", m.chunks, " chunks of ",
                  messageChunkSize(bytes, m.chunking), " bytes (MAESTRO_CHUNK_SIZE differs between ranks?)");
    early.push_back(span);
  }
  m.early.clear();
  return early;
}

Reassembler::Landed Reassembler::land(uint32_t tag, uint32_t chunk, uint64_t length, ChunkSpan* span_out,
                                      std::shared_ptr<ChunkHook>* hook_out, std::string* error) {
  if (tag >= kUsedTags || chunk >= kMaxChunksPerMessage) {
    *error = strcat("chunk id out of range (tag ", tag, ", chunk ", chunk, ")");
    return Landed::kError;
  }
  Message& m = at(tag);
  if (m.released) return Landed::kDuplicate;
  if (m.expected && chunk >= m.chunks) {
    *error = strcat("chunk ", chunk, " of message ", tag, " but the message has only ", m.chunks, " chunks");
    return Landed::kError;
  }
  if (!testAndSet(m, chunk)) return Landed::kDuplicate;
  ++m.landed;
  if (!m.expected) {
    m.early.emplace_back(chunk, length);
    return Landed::kEarly;
  }
  ChunkSpan span = chunkAt(m.bytes, m.chunking, chunk);
  if (span.length != length) {
    *error = strcat("chunk ", chunk, " of message ", tag, " carried ", length, " bytes, expected ", span.length,
                    " (MAESTRO_CHUNK_SIZE differs between ranks?)");
    return Landed::kError;
  }
  *span_out = span;
  *hook_out = m.hook;
  return Landed::kNew;
}

bool Reassembler::processed(uint32_t tag) {
  Message& m = at(tag);
  ++m.processed;
  return m.processed == m.chunks;
}

bool Reassembler::complete(uint32_t tag) const {
  if (messages_.empty()) return false;
  const Message& m = messages_[tag];
  return m.expected && m.processed == m.chunks;
}

bool Reassembler::landed(uint32_t tag, uint32_t chunk) const {
  if (messages_.empty() || tag >= kUsedTags) return false;
  const Message& m = messages_[tag];
  return m.released || isSet(m, chunk);
}

void Reassembler::release(uint32_t tag) {
  Message& m = at(tag);
  m = Message();
  m.released = true;
}

void Reassembler::reset(uint32_t first, uint32_t count) {
  MAESTRO_CHECK(first <= kUsedTags && count <= kUsedTags - first, "tags [", first, ", +", count, ") out of range");
  if (messages_.empty()) return;  // nothing to forget
  for (uint32_t t = first; t < first + count; ++t) messages_[t] = Message();
}

size_t Reassembler::active() const {
  size_t n = 0;
  for (const auto& m : messages_) n += m.inUse() ? 1 : 0;
  return n;
}

}  // namespace multipath
}  // namespace maestro
