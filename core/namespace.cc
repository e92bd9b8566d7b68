// SPDX-License-Identifier: Apache-2.0
#include "core/namespace.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/block_key.h"
#include "core/checked.h"

namespace kvtier {
namespace {

void PutString(std::string* out, absl::string_view s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  out->append(reinterpret_cast<const char*>(&n), 4);
  out->append(s.data(), s.size());
}
void PutU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }

// `shown`: the field reaches logs, the status JSON and kvtierctl's tables,
// so it must be printable UTF-8 (no control characters or escapes). The
// salt is a secret that is never shown: any bytes.
absl::Status CheckString(absl::string_view field, const std::string& v, bool required, bool shown = true) {
  if (required && v.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("namespace field ", field, " is required"));
  }
  if (v.size() > kMaxDescriptorString) {
    return absl::InvalidArgumentError(absl::StrCat("namespace field ", field, " is ", v.size(),
                                                   " bytes; the limit is ", kMaxDescriptorString));
  }
  if (shown && !IsPrintableUtf8(v)) {
    return absl::InvalidArgumentError(absl::StrCat("namespace field ", field,
                                                   " is not printable UTF-8 (control characters or invalid bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateDescriptor(const NamespaceDescriptor& d) {
  if (auto s = CheckString("model_id", d.model_id, true); !s.ok()) return s;
  if (auto s = CheckString("model_revision", d.model_revision, false); !s.ok()) return s;
  if (auto s = CheckString("tokenizer_revision", d.tokenizer_revision, false); !s.ok()) return s;
  if (auto s = CheckString("adapter_id", d.adapter_id, false); !s.ok()) return s;
  if (auto s = CheckString("attention_config_hash", d.attention_config_hash, false); !s.ok()) return s;
  if (auto s = CheckString("kv_dtype", d.kv_dtype, true); !s.ok()) return s;
  if (auto s = CheckString("kv_layout", d.kv_layout, true); !s.ok()) return s;
  if (auto s = CheckString("cache_salt", d.cache_salt, false, /*shown=*/false); !s.ok()) return s;
  if (d.block_tokens == 0 || d.block_tokens > kMaxBlockTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace block_tokens must be in 1..", kMaxBlockTokens, ", got ", d.block_tokens));
  }
  if (d.block_bytes == 0 || d.block_bytes > kMaxBlockBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace block_bytes must be in 1..", kMaxBlockBytes, ", got ", d.block_bytes));
  }
  if (d.tp_size == 0 || d.tp_rank >= d.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("namespace tp_rank (", d.tp_rank,
                                                   ") must be below tp_size (", d.tp_size, ")"));
  }
  return absl::OkStatus();
}

NamespaceId ComputeNamespaceId(const NamespaceDescriptor& d, absl::string_view tenant,
                               absl::string_view tenant_salt) {
  std::string buf = "kvtier-namespace-v1";
  PutString(&buf, d.model_id);
  PutString(&buf, d.model_revision);
  PutString(&buf, d.tokenizer_revision);
  PutString(&buf, d.adapter_id);
  PutString(&buf, d.attention_config_hash);
  PutString(&buf, d.kv_dtype);
  PutString(&buf, d.kv_layout);
  PutString(&buf, d.cache_salt);
  PutU64(&buf, d.block_tokens);
  PutU64(&buf, d.block_bytes);
  PutU64(&buf, d.tp_rank);
  PutU64(&buf, d.tp_size);
  PutString(&buf, tenant);
  PutString(&buf, tenant_salt);
  return Sha256(std::as_bytes(std::span(buf.data(), buf.size())));
}

std::string ShortId(const BlockKey& id) { return id.Hex().substr(0, 12); }

}  // namespace kvtier
