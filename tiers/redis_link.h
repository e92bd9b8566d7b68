// SPDX-License-Identifier: Apache-2.0
// One connection to a Redis node, in clear or over TLS: RedisCluster's
// transport. hiredis keeps the reader (reply parsing) and the error; the
// bytes go through these functions, which use OpenSSL on the same socket
// when the link has a TLS session (hiredis 0.14 has no TLS of its own).
//
// Sockets are blocking with SO_RCVTIMEO/SO_SNDTIMEO (the io timeout), so no
// single read or write waits longer than that; callers bound whole replies
// with LinkWaitReadable's deadline. Every failure sets ctx->err/errstr.
#ifndef KVTIER_TIERS_REDIS_LINK_H_
#define KVTIER_TIERS_REDIS_LINK_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tiers/redis_cluster.h"

struct redisContext;  // hiredis
typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace kvtier {

struct RedisLink {
  redisContext* ctx = nullptr;
  SSL* ssl = nullptr;  // null: clear text
};

// Frees the TLS session and the context; the link is empty after.
void CloseLink(RedisLink& link);

// True when a read would find bytes now (TLS may hold decrypted bytes the
// socket no longer shows), waiting at most until deadline_ns.
bool LinkWaitReadable(RedisLink& link, uint64_t deadline_ns);
// Reads what arrives (up to 16 KiB) into hiredis's reader.
bool LinkFill(RedisLink& link);
// Reads up to n bytes: > 0 read; -1 the link broke or timed out (ctx->err set).
ssize_t LinkRead(RedisLink& link, char* to, size_t n);
// Writes every byte of iov[0..n) (it may be modified). False on error.
bool LinkWriteAll(RedisLink& link, iovec* iov, int n);
// Writes what hiredis formatted into its output buffer (AUTH, CLUSTER SLOTS).
bool LinkFlush(RedisLink& link);

// The client side of TLS for every link of one cluster.
class RedisTls {
 public:
  // Loads the CA, and the client certificate and key when given.
  // InvalidArgument naming the file that does not load and why.
  static absl::StatusOr<std::unique_ptr<RedisTls>> Create(const RedisTlsOptions& opts);
  ~RedisTls();
  RedisTls(const RedisTls&) = delete;
  RedisTls& operator=(const RedisTls&) = delete;

  // Starts TLS on the link's socket and checks the node's certificate
  // against the CA and `host` (or server_name). False, with *why, when the
  // node does not prove itself: nothing else has been sent to it then.
  bool Handshake(RedisLink& link, const std::string& host, std::string* why) const;

 private:
  RedisTls(SSL_CTX* ctx, std::string server_name) : ctx_(ctx), server_name_(std::move(server_name)) {}
  SSL_CTX* const ctx_;
  const std::string server_name_;
};

}  // namespace kvtier

#endif  // KVTIER_TIERS_REDIS_LINK_H_
