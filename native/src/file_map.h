// A read view of a byte range of a file through mmap: how a decode on the shard owner's host reads
// KV chunks with no copy (the shard is a tmpfs file, so the mapping shares its pages). The mapping
// is private and writable: a stray write lands in a private page, never in the owner's shard.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace ctx {

// Why a mapping failed: `code` is "ENOENT" (no such file), "ERANGE" (the range lies outside the
// file), "EINVAL" (an empty range or not a regular file), "ESTALE" (the file is not the one
// expected: another device:inode) or another errno name.
struct FileMapError : std::runtime_error {
  FileMapError(const std::string& code, const std::string& message) : std::runtime_error(message), code(code) {}
  std::string code;
};

class FileMap {
 public:
  // Maps [offset, offset + length) of the regular file at `path`; throws FileMapError (naming
  // the file and the reason) when it is missing, not regular, or shorter than the range. With
  // `expect_id` ("device:inode", as file_identity gives), the opened file must be that one, so a
  // file planted at the path (or a later file with the same name) is refused, checked on the
  // descriptor that is mapped (no window between the check and the map). With `populate`, the
  // range's pages are mapped in at once (MADV_POPULATE_READ); without, populate() does it later.
  FileMap(const std::string& path, uint64_t offset, uint64_t length, const std::string& expect_id = "", bool populate = true);
  ~FileMap();
  FileMap(const FileMap&) = delete;
  FileMap& operator=(const FileMap&) = delete;

  uint8_t* data() const { return data_; }  // the byte at `offset`; null after unmap()
  size_t size() const { return size_; }
  bool mapped() const { return base_ != nullptr; }
  void unmap();
  // Maps in the file's pages behind bytes [offset, offset + length) of the view (read faults taken
  // all at once; best effort: kernels before 5.14 cannot). Safe from any thread while mapped.
  void populate(size_t offset, size_t length) const;

 private:
  void* base_ = nullptr;  // page-aligned start of the mapping
  size_t mapped_bytes_ = 0;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// "device:inode" of a stat result, in decimal: what the registry records for a shard file.
std::string file_identity(uint64_t dev, uint64_t ino);

// Returns the pages of [offset, offset + length) of the open file `fd` to the system
// (fallocate PUNCH_HOLE | KEEP_SIZE), shrunk inward to whole pages; the file keeps its size and
// reads of the range give zeros. Returns 0 or the errno (EOPNOTSUPP where the file system
// cannot punch holes).
int punch_hole(int fd, uint64_t offset, uint64_t length);

}  // namespace ctx
