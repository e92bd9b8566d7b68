// SPDX-License-Identifier: Apache-2.0
#include "core/status.h"

#include <cerrno>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(StatusTest, CodesSurviveTheRoundTrip) {
  for (int code : {KVTIER_EIO, KVTIER_ENOENT, KVTIER_ENOMEM, KVTIER_EACCES, KVTIER_EBUSY, KVTIER_EEXIST,
                   KVTIER_EINVAL, KVTIER_ENOSPC, KVTIER_EPROTO, KVTIER_EPROTONOSUPPORT, KVTIER_ENOTCONN,
                   KVTIER_ETIMEDOUT, KVTIER_ECANCELED}) {
    absl::Status s = CodedStatus(code, "why");
    EXPECT_EQ(ToErrorCode(s), code);
    Status p = ToPublic(s);
    EXPECT_EQ(p.raw_code(), code);
    EXPECT_EQ(p.message(), "why");
    EXPECT_NE(std::string(kvtier_strerror(code)), "unknown error");
  }
  EXPECT_EQ(ToErrorCode(absl::OkStatus()), 0);
  EXPECT_EQ(ToErrorCode(absl::NotFoundError("x")), KVTIER_ENOENT);
  EXPECT_EQ(ToErrorCode(absl::ResourceExhaustedError("x")), KVTIER_ENOSPC);
  EXPECT_EQ(ToErrorCode(ErrnoStatus(EACCES, "open")), KVTIER_EACCES);
  EXPECT_NE(std::string(ErrnoStatus(ENOENT, "open /x").message()).find("open /x"), std::string::npos);
  EXPECT_EQ(ToPublic(CodedStatus(KVTIER_ENOSPC, "full")).ToString(), "no space: full");
}

}  // namespace
}  // namespace kvtier
