// SPDX-License-Identifier: Apache-2.0
// Bounded little-endian byte readers and writers for socket messages.
#ifndef KVTIER_IPC_WIRE_H_
#define KVTIER_IPC_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::ipc {

class ByteWriter {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
  }
  void PutBytes(std::span<const uint8_t> b) {
    const auto* p = reinterpret_cast<const std::byte*>(b.data());
    buf_.insert(buf_.end(), p, p + b.size());
  }
  // A string with a u16 length prefix; longer strings are cut at 65535.
  void PutString(absl::string_view s) {
    const uint16_t n = static_cast<uint16_t>(std::min<size_t>(s.size(), 0xffff));
    Put(n);
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    buf_.insert(buf_.end(), p, p + n);
  }
  std::vector<std::byte>& bytes() { return buf_; }

 private:
  std::vector<std::byte> buf_;
};

// Every getter returns false, and leaves the reader failed, on a short read.
class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> data) : data_(data) {}
  template <typename T>
  bool Get(T* v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (failed_ || data_.size() - pos_ < sizeof(T)) return Fail();
    std::memcpy(v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetBytes(std::span<uint8_t> out) {
    if (failed_ || data_.size() - pos_ < out.size()) return Fail();
    std::memcpy(out.data(), data_.data() + pos_, out.size());
    pos_ += out.size();
    return true;
  }
  bool GetString(std::string* s, size_t max_len) {
    uint16_t n = 0;
    if (!Get(&n)) return false;
    if (n > max_len || data_.size() - pos_ < n) return Fail();
    s->assign(reinterpret_cast<const char*>(data_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool AtEnd() const { return !failed_ && pos_ == data_.size(); }
  bool failed() const { return failed_; }

 private:
  bool Fail() {
    failed_ = true;
    return false;
  }
  std::span<const std::byte> data_;
  size_t pos_ = 0;
  bool failed_ = false;
};

}  // namespace kvtier::ipc

#endif  // KVTIER_IPC_WIRE_H_
