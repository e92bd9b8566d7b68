// SPDX-License-Identifier: Apache-2.0
#include "core/namespace.h"

#include <functional>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

NamespaceDescriptor Llama() {
  NamespaceDescriptor d;
  d.model_id = "meta-llama/Llama-3.1-8B";
  d.model_revision = "0e9e39f";
  d.tokenizer_revision = "0e9e39f";
  d.kv_dtype = "bf16";
  d.kv_layout = "layer_major";
  d.block_tokens = 16;
  d.block_bytes = 131072;
  d.tp_rank = 0;
  d.tp_size = 1;
  return d;
}

// Computed independently (Python hashlib) from the encoding in namespace.h.
TEST(NamespaceTest, IdVectorNeverChanges) {
  EXPECT_EQ(ComputeNamespaceId(Llama(), "default", "").Hex(),
            "5f60fb86ec90c9be379356d8e615634e016d9dd0eeef4fe591530d55057540a5");
}

TEST(NamespaceTest, EveryFieldChangesTheId) {
  const NamespaceId base = ComputeNamespaceId(Llama(), "default", "");
  std::vector<std::function<void(NamespaceDescriptor&)>> edits = {
      [](auto& d) { d.model_id += "x"; },          [](auto& d) { d.model_revision = "other"; },
      [](auto& d) { d.tokenizer_revision = "t2"; }, [](auto& d) { d.adapter_id = "lora-1"; },
      [](auto& d) { d.attention_config_hash = "rope-scaled"; }, [](auto& d) { d.kv_dtype = "fp8_e4m3"; },
      [](auto& d) { d.kv_layout = "vllm_paged"; }, [](auto& d) { d.cache_salt = "s"; },
      [](auto& d) { d.block_tokens = 32; },         [](auto& d) { d.block_bytes = 65536; },
      [](auto& d) { d.tp_rank = 1; d.tp_size = 2; }, [](auto& d) { d.tp_size = 2; },
  };
  for (size_t i = 0; i < edits.size(); ++i) {
    NamespaceDescriptor d = Llama();
    edits[i](d);
    EXPECT_NE(ComputeNamespaceId(d, "default", ""), base) << "edit " << i;
  }
  EXPECT_NE(ComputeNamespaceId(Llama(), "other-tenant", ""), base);
  EXPECT_NE(ComputeNamespaceId(Llama(), "default", "tenant-salt"), base);
  // Field boundaries are length-prefixed: moving a byte between fields changes the id.
  NamespaceDescriptor a = Llama(), b = Llama();
  a.model_revision = "ab";
  a.tokenizer_revision = "c";
  b.model_revision = "a";
  b.tokenizer_revision = "bc";
  EXPECT_NE(ComputeNamespaceId(a, "t", ""), ComputeNamespaceId(b, "t", ""));
}

TEST(NamespaceTest, ValidationNamesTheField) {
  EXPECT_TRUE(ValidateDescriptor(Llama()).ok());
  auto expect_error = [](NamespaceDescriptor d, const std::string& field) {
    absl::Status s = ValidateDescriptor(d);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(std::string(s.message()).find(field), std::string::npos) << s.message();
  };
  NamespaceDescriptor d = Llama();
  d.model_id.clear();
  expect_error(d, "model_id");
  d = Llama();
  d.kv_dtype.clear();
  expect_error(d, "kv_dtype");
  d = Llama();
  d.block_tokens = 0;
  expect_error(d, "block_tokens");
  d = Llama();
  d.block_bytes = 0;
  expect_error(d, "block_bytes");
  d = Llama();
  d.block_bytes = kMaxBlockBytes + 1;
  expect_error(d, "block_bytes");
  d = Llama();
  d.tp_rank = 2;
  d.tp_size = 2;
  expect_error(d, "tp_rank");
  d = Llama();
  d.adapter_id = std::string(kMaxDescriptorString + 1, 'a');
  expect_error(d, "adapter_id");
}

}  // namespace
}  // namespace kvtier
