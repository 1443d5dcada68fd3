#include "file_map.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace ctx {

namespace {
[[noreturn]] void fail(const std::string& path, const char* code, const std::string& why) {
  throw FileMapError(code, "cannot map " + path + ": " + why);
}
const char* errno_name(int e) { return e == ENOENT ? "ENOENT" : e == EACCES ? "EACCES" : e == ENOMEM ? "ENOMEM" : "EIO"; }
}  // namespace

std::string file_identity(uint64_t dev, uint64_t ino) { return std::to_string(dev) + ":" + std::to_string(ino); }

int punch_hole(int fd, uint64_t offset, uint64_t length) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (length > UINT64_MAX - offset) return EINVAL;
  const uint64_t start = (offset + page - 1) / page * page;
  const uint64_t end = (offset + length) / page * page;
  if (end <= start) return 0;  // no whole page inside the range
  if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(start), static_cast<off_t>(end - start)) != 0)
    return errno;
  return 0;
}

FileMap::FileMap(const std::string& path, uint64_t offset, uint64_t length, const std::string& expect_id, bool populate) {
  if (length == 0) fail(path, "EINVAL", "the range is empty");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, errno_name(errno), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "EINVAL", "not a regular file");
  }
  if (!expect_id.empty()) {
    const std::string id = file_identity(static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino));
    if (id != expect_id) {
      ::close(fd);
      fail(path, "ESTALE", "the file is " + id + " (device:inode), not the registered " + expect_id);
    }
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (offset > file_size || length > file_size - offset) {
    ::close(fd);
    fail(path, "ERANGE",
         "bytes " + std::to_string(offset) + "+" + std::to_string(length) + " lie outside the " + std::to_string(file_size) + "-byte file");
  }
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = offset - offset % page;
  mapped_bytes_ = static_cast<size_t>(offset + length - start);
  // No MAP_POPULATE: on a private writable mapping it would write-fault, copying every page.
  // Read faults map the file's own pages; MADV_POPULATE_READ below takes them all at once.
  void* p = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, static_cast<off_t>(start));
  const int err = errno;
  ::close(fd);  // the mapping keeps the file's pages alive
  if (p == MAP_FAILED) fail(path, errno_name(err), std::strerror(err));
  base_ = p;
  data_ = static_cast<uint8_t*>(p) + (offset - start);
  size_ = static_cast<size_t>(length);
  if (populate) this->populate(0, size_);
}

void FileMap::populate(size_t offset, size_t length) const {
#ifdef MADV_POPULATE_READ
  // The reader reads every byte (a KV import): mapping the pages in one call costs less than
  // taking their read faults as the import reaches them. Best effort: kernels before 5.14 refuse it.
  if (!base_ || offset >= size_ || length == 0) return;
  length = std::min(length, size_ - offset);
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data_ + offset) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(data_ + offset + length);
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ);
#else
  (void)offset;
  (void)length;
#endif
}

void FileMap::unmap() {
  if (base_) ::munmap(base_, mapped_bytes_);
  base_ = nullptr;
  data_ = nullptr;
}

FileMap::~FileMap() { unmap(); }

}  // namespace ctx
