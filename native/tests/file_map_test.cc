// FileMap: the mapped bytes are the file's at any (unaligned) offset, writes stay private, and
// bad paths and ranges are refused with the reason.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "file_map.h"

namespace {

std::string temp_file(const std::vector<uint8_t>& bytes) {
  char name[] = "/tmp/ctxbank-filemap-XXXXXX";
  const int fd = mkstemp(name);
  EXPECT_GE(fd, 0);
  FILE* f = fdopen(fd, "wb");
  fwrite(bytes.data(), 1, bytes.size(), f);
  fclose(f);
  return name;
}

TEST(FileMap, ViewsTheFileBytesAtAnUnalignedOffset) {
  std::vector<uint8_t> bytes(3 * 4096 + 100);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);
  const std::string path = temp_file(bytes);
  {
    ctx::FileMap m(path, 4097, 8000);
    ASSERT_TRUE(m.mapped());
    EXPECT_EQ(m.size(), 8000u);
    for (size_t i = 0; i < 8000; ++i) ASSERT_EQ(m.data()[i], bytes[4097 + i]) << i;
    m.data()[0] ^= 0xff;  // private: the file keeps its byte
    m.unmap();
    EXPECT_FALSE(m.mapped());
    EXPECT_EQ(m.data(), nullptr);
  }
  std::ifstream in(path, std::ios::binary);
  in.seekg(4097);
  EXPECT_EQ(static_cast<uint8_t>(in.get()), bytes[4097]);
  std::remove(path.c_str());
}

TEST(FileMap, PopulatesARangeLaterAndIgnoresRangesPastTheEnd) {
  std::vector<uint8_t> bytes(3 * 4096 + 100);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 5 + 1);
  const std::string path = temp_file(bytes);
  {
    ctx::FileMap m(path, 100, bytes.size() - 100, "", /*populate=*/false);
    m.populate(4000, 5000);          // an unaligned range inside the view
    m.populate(m.size() - 1, 4096);  // clipped to the view
    m.populate(m.size(), 1);         // past the end: nothing
    for (size_t i = 0; i < m.size(); ++i) ASSERT_EQ(m.data()[i], bytes[100 + i]) << i;
    m.unmap();
    m.populate(0, 1);  // unmapped: nothing
  }
  std::remove(path.c_str());
}

TEST(FileMap, RefusesMissingFilesAndRangesOutsideTheFile) {
  const std::string path = temp_file(std::vector<uint8_t>(1000, 1));
  EXPECT_THROW(ctx::FileMap("/nonexistent/ctxbank", 0, 1), std::runtime_error);
  EXPECT_THROW(ctx::FileMap("/tmp", 0, 1), std::runtime_error);
  EXPECT_THROW(ctx::FileMap(path, 0, 0), std::runtime_error);
  EXPECT_THROW(ctx::FileMap(path, 999, 2), std::runtime_error);
  EXPECT_THROW(ctx::FileMap(path, 2000, 1), std::runtime_error);
  EXPECT_THROW(ctx::FileMap(path, 1, UINT64_MAX), std::runtime_error);
  try {
    ctx::FileMap(path, 900, 200);
    FAIL();
  } catch (const ctx::FileMapError& e) {
    EXPECT_NE(std::string(e.what()).find("bytes 900+200 lie outside the 1000-byte file"), std::string::npos) << e.what();
    EXPECT_EQ(e.code, "ERANGE");
  }
  EXPECT_NO_THROW(ctx::FileMap(path, 999, 1));
  std::remove(path.c_str());
}

// A mapping that names the file it expects (device:inode, as the registry records a shard file)
// refuses another file at the same path: one planted after the owner created its shard.
TEST(FileMap, RefusesAFileThatIsNotTheExpectedOne) {
  const std::string path = temp_file(std::vector<uint8_t>(8192, 5));
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  const std::string id = ctx::file_identity(st.st_dev, st.st_ino);
  EXPECT_NO_THROW(ctx::FileMap(path, 0, 100, id));
  {
    // Renamed over the path while the original still exists, so it surely has another inode
    // (a file created after the original's removal may reuse its inode number).
    std::ofstream planted(path + ".planted", std::ios::binary);
    planted << std::string(8192, 'x');
  }
  ASSERT_EQ(std::rename((path + ".planted").c_str(), path.c_str()), 0);
  try {
    ctx::FileMap(path, 0, 100, id);
    FAIL() << "a planted file was mapped";
  } catch (const ctx::FileMapError& e) {
    EXPECT_EQ(e.code, "ESTALE");
    EXPECT_NE(std::string(e.what()).find("not the registered " + id), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

// Punching a freed range returns its pages (the file's allocated blocks go down) and keeps the
// size; the bytes outside the range are untouched, those inside read as zeros.
TEST(FileMap, PunchHoleReturnsWholePagesOnly) {
  std::vector<uint8_t> bytes(16 * 4096, 7);
  const std::string path = temp_file(bytes);
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  struct stat before {
  }, after{};
  ASSERT_EQ(::fstat(fd, &before), 0);
  const int err = ctx::punch_hole(fd, 4096 + 10, 8 * 4096);  // pages 2..8 whole; 1 and 9 partly
  if (err == EOPNOTSUPP) GTEST_SKIP() << "this file system cannot punch holes";
  ASSERT_EQ(err, 0);
  ASSERT_EQ(::fstat(fd, &after), 0);
  EXPECT_EQ(after.st_size, before.st_size);
  EXPECT_LT(after.st_blocks, before.st_blocks);
  uint8_t b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, 4096 + 10), 1);
  EXPECT_EQ(b, 7);  // the partial page is kept
  ASSERT_EQ(::pread(fd, &b, 1, 2 * 4096), 1);
  EXPECT_EQ(b, 0);
  ASSERT_EQ(::pread(fd, &b, 1, 9 * 4096 + 9), 1);
  EXPECT_EQ(b, 7);
  EXPECT_EQ(ctx::punch_hole(fd, 10, 100), 0);  // no whole page: nothing to do
  ::close(fd);
  std::remove(path.c_str());
}

}  // namespace
