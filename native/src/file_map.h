// A read view of a byte range of a file through mmap: how a decode on the shard owner's host reads
// KV chunks with no copy (the shard is a tmpfs file, so the mapping shares its pages). The mapping
// is private and writable: a stray write lands in a private page, never in the owner's shard.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace ctx {

class FileMap {
 public:
  // Maps [offset, offset + length) of the regular file at `path`; throws std::runtime_error
  // (naming the file and the reason) when it is missing, not regular, or shorter than the range.
  FileMap(const std::string& path, uint64_t offset, uint64_t length);
  ~FileMap();
  FileMap(const FileMap&) = delete;
  FileMap& operator=(const FileMap&) = delete;

  uint8_t* data() const { return data_; }  // the byte at `offset`; null after unmap()
  size_t size() const { return size_; }
  bool mapped() const { return base_ != nullptr; }
  void unmap();

 private:
  void* base_ = nullptr;  // page-aligned start of the mapping
  size_t mapped_bytes_ = 0;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ctx
