// FileMap: the mapped bytes are the file's at any (unaligned) offset, writes stay private, and
// bad paths and ranges are refused with the reason.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

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

}  // namespace
