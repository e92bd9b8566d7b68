// SPDX-License-Identifier: Apache-2.0
// RedisLink and RedisTls (redis_link.h): OpenSSL over the socket hiredis
// connected, through a BIO of our own that sends with MSG_NOSIGNAL (a node
// that resets the connection is an error, not SIGPIPE).
#include "tiers/redis_link.h"

// hiredis 0.14's sds.h has no extern "C" of its own.
extern "C" {
#include <hiredis/sds.h>
}
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/units.h"

namespace kvtier {

namespace {

void SetError(redisContext* c, int type, const std::string& what) {
  c->err = type;
  std::snprintf(c->errstr, sizeof(c->errstr), "%s", what.c_str());
}

// OpenSSL's last error on this thread, in words (and the queue cleared).
std::string SslError(const char* what) {
  std::string out = what;
  char buf[256];
  unsigned long e;
  bool first = true;
  while ((e = ERR_get_error()) != 0) {
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, first ? ": " : "; ", buf);
    first = false;
  }
  return out;
}

// The socket BIO: the fd in the BIO's data.
int FdOf(BIO* b) { return static_cast<int>(reinterpret_cast<intptr_t>(BIO_get_data(b))); }
int BioWrite(BIO* b, const char* data, int n) {
  BIO_clear_retry_flags(b);
  for (;;) {
    const ssize_t w = send(FdOf(b), data, static_cast<size_t>(n), MSG_NOSIGNAL);
    if (w >= 0) return static_cast<int>(w);
    if (errno != EINTR) return -1;  // EAGAIN here is the send timeout: an error
  }
}
int BioRead(BIO* b, char* data, int n) {
  BIO_clear_retry_flags(b);
  for (;;) {
    const ssize_t r = recv(FdOf(b), data, static_cast<size_t>(n), 0);
    if (r >= 0) return static_cast<int>(r);
    if (errno != EINTR) return -1;
  }
}
long BioCtrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }
int BioCreate(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}
const BIO_METHOD* SocketMethod() {
  static BIO_METHOD* m = [] {
    BIO_METHOD* bm = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "kvtier redis socket");
    BIO_meth_set_write(bm, BioWrite);
    BIO_meth_set_read(bm, BioRead);
    BIO_meth_set_ctrl(bm, BioCtrl);
    BIO_meth_set_create(bm, BioCreate);
    return bm;
  }();
  return m;
}

std::string SslIoError(SSL* ssl, int rc, const char* what) {
  const int e = SSL_get_error(ssl, rc);
  if (e == SSL_ERROR_ZERO_RETURN) return "server closed the connection";
  if (e == SSL_ERROR_SYSCALL) {
    if (ERR_peek_error() == 0) {
      return errno == EAGAIN ? absl::StrCat(what, " timed out")
                             : errno == 0 ? std::string("server closed the connection") : std::string(std::strerror(errno));
    }
  }
  return SslError(absl::StrCat("TLS ", what).c_str());
}

}  // namespace

void CloseLink(RedisLink& link) {
  if (link.ssl != nullptr) SSL_free(link.ssl);  // frees its BIO too
  if (link.ctx != nullptr) redisFree(link.ctx);
  link = {};
}

bool LinkWaitReadable(RedisLink& link, uint64_t deadline_ns) {
  if (link.ssl != nullptr && SSL_pending(link.ssl) > 0) return true;
  for (;;) {
    const uint64_t now = MonotonicNanos();
    const int ms = now >= deadline_ns ? 0 : static_cast<int>(std::min<uint64_t>((deadline_ns - now) / 1'000'000 + 1, 60000));
    pollfd p{link.ctx->fd, POLLIN, 0};
    const int n = poll(&p, 1, ms);
    if (n > 0) return true;
    if (n < 0 && errno == EINTR) continue;
    SetError(link.ctx, REDIS_ERR_IO, n == 0 ? "reply not complete in time" : std::strerror(errno));
    return false;
  }
}

ssize_t LinkRead(RedisLink& link, char* to, size_t n) {
  if (link.ssl == nullptr) {
    for (;;) {
      const ssize_t k = recv(link.ctx->fd, to, n, 0);
      if (k > 0) return k;
      if (k < 0 && errno == EINTR) continue;
      SetError(link.ctx, REDIS_ERR_IO,
               k == 0 ? "server closed the connection" : errno == EAGAIN ? "read timed out" : std::strerror(errno));
      return -1;
    }
  }
  ERR_clear_error();
  errno = 0;
  const int k = SSL_read(link.ssl, to, static_cast<int>(std::min<size_t>(n, INT_MAX)));
  if (k > 0) return k;
  SetError(link.ctx, REDIS_ERR_IO, SslIoError(link.ssl, k, "read"));
  return -1;
}

bool LinkFill(RedisLink& link) {
  if (link.ssl == nullptr) return redisBufferRead(link.ctx) == REDIS_OK;
  char buf[16 * 1024];
  const ssize_t k = LinkRead(link, buf, sizeof(buf));
  if (k < 0) return false;
  if (redisReaderFeed(link.ctx->reader, buf, static_cast<size_t>(k)) != REDIS_OK) {
    SetError(link.ctx, REDIS_ERR_PROTOCOL, link.ctx->reader->errstr);
    return false;
  }
  return true;
}

namespace {

bool SslWrite(RedisLink& link, const char* data, size_t n) {
  while (n > 0) {
    ERR_clear_error();
    errno = 0;
    const int w = SSL_write(link.ssl, data, static_cast<int>(std::min<size_t>(n, INT_MAX)));
    if (w <= 0) {
      SetError(link.ctx, REDIS_ERR_IO, SslIoError(link.ssl, w, "write"));
      return false;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

bool LinkWriteAll(RedisLink& link, iovec* iov, int n) {
  if (link.ssl != nullptr) {
    // Small commands (a pipeline of EXISTS) gathered into records of up to
    // 16 KiB: one TLS record and one send each, not one per command.
    constexpr size_t kRecord = 16 * 1024;
    std::string gather;
    for (int i = 0; i < n; ++i) {
      const char* p = static_cast<const char*>(iov[i].iov_base);
      if (iov[i].iov_len < kRecord) {
        gather.append(p, iov[i].iov_len);
        if (gather.size() < kRecord) continue;
      } else if (!gather.empty() && !SslWrite(link, gather.data(), gather.size())) {
        return false;
      } else {
        gather.clear();
        if (!SslWrite(link, p, iov[i].iov_len)) return false;
        continue;
      }
      if (!SslWrite(link, gather.data(), gather.size())) return false;
      gather.clear();
    }
    return gather.empty() || SslWrite(link, gather.data(), gather.size());
  }
  int at = 0;
  while (at < n) {
    msghdr msg{};
    msg.msg_iov = iov + at;
    msg.msg_iovlen = static_cast<size_t>(std::min(n - at, IOV_MAX));
    const ssize_t w = sendmsg(link.ctx->fd, &msg, MSG_NOSIGNAL);  // a reset peer is an error, not SIGPIPE
    if (w < 0) {
      if (errno == EINTR) continue;
      SetError(link.ctx, REDIS_ERR_IO, errno == EAGAIN ? "write timed out" : std::strerror(errno));
      return false;
    }
    // Past what was written: whole iovecs, then into one.
    size_t left = static_cast<size_t>(w);
    while (at < n && left >= iov[at].iov_len) left -= iov[at++].iov_len;
    if (left > 0) {
      iov[at].iov_base = static_cast<char*>(iov[at].iov_base) + left;
      iov[at].iov_len -= left;
    }
  }
  return true;
}

bool LinkFlush(RedisLink& link) {
  redisContext* c = link.ctx;
  if (link.ssl == nullptr) {
    int done = 0;
    do {
      if (redisBufferWrite(c, &done) == REDIS_ERR) return false;
    } while (done == 0);
    return true;
  }
  iovec iov{c->obuf, sdslen(c->obuf)};
  if (!LinkWriteAll(link, &iov, 1)) return false;
  sdsfree(c->obuf);
  c->obuf = sdsempty();
  return c->obuf != nullptr;
}

absl::StatusOr<std::unique_ptr<RedisTls>> RedisTls::Create(const RedisTlsOptions& opts) {
  if (opts.ca_file.empty()) {
    return absl::InvalidArgumentError("TLS needs a CA file (tls_ca_file) to check the nodes' certificates against");
  }
  if (opts.cert_file.empty() != opts.key_file.empty()) {
    return absl::InvalidArgumentError("a TLS client certificate needs both its certificate and its key file");
  }
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) return absl::InternalError(SslError("cannot make a TLS context"));
  auto fail = [&](std::string why) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(std::move(why));
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
  if (SSL_CTX_load_verify_locations(ctx, opts.ca_file.c_str(), nullptr) != 1) {
    return fail(SslError(absl::StrCat("TLS CA file ", opts.ca_file, " does not load").c_str()));
  }
  if (!opts.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, opts.cert_file.c_str()) != 1) {
      return fail(SslError(absl::StrCat("TLS certificate file ", opts.cert_file, " does not load").c_str()));
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, opts.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
      return fail(SslError(absl::StrCat("TLS key file ", opts.key_file, " does not load").c_str()));
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
      return fail(absl::StrCat("TLS key file ", opts.key_file, " is not the key of ", opts.cert_file));
    }
  }
  return std::unique_ptr<RedisTls>(new RedisTls(ctx, opts.server_name));
}

RedisTls::~RedisTls() { SSL_CTX_free(ctx_); }

bool RedisTls::Handshake(RedisLink& link, const std::string& host, std::string* why) const {
  ERR_clear_error();
  SSL* ssl = SSL_new(ctx_);
  BIO* bio = ssl == nullptr ? nullptr : BIO_new(SocketMethod());
  if (bio == nullptr) {
    if (ssl != nullptr) SSL_free(ssl);
    *why = SslError("cannot start TLS");
    return false;
  }
  BIO_set_data(bio, reinterpret_cast<void*>(static_cast<intptr_t>(link.ctx->fd)));
  SSL_set_bio(ssl, bio, bio);
  link.ssl = ssl;  // freed by CloseLink from here on
  // The name the certificate must carry: an IP address, or a host name
  // (also sent as SNI).
  const std::string& name = server_name_.empty() ? host : server_name_;
  in6_addr addr;
  const bool is_ip = inet_pton(AF_INET, name.c_str(), &addr) == 1 || inet_pton(AF_INET6, name.c_str(), &addr) == 1;
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  const int named = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str())
                          : X509_VERIFY_PARAM_set1_host(param, name.c_str(), name.size());
  if (named != 1 || (!is_ip && SSL_set_tlsext_host_name(ssl, name.c_str()) != 1)) {
    *why = SslError(absl::StrCat("TLS: cannot check certificates for \"", name.substr(0, 80), "\"").c_str());
    return false;
  }
  errno = 0;
  const int rc = SSL_connect(ssl);
  if (rc == 1) return true;
  const long verify = SSL_get_verify_result(ssl);
  if (verify != X509_V_OK) {
    ERR_clear_error();
    *why = absl::StrCat("TLS: the node's certificate does not prove it is \"", name.substr(0, 80),
                        "\": ", X509_verify_cert_error_string(verify));
  } else {
    *why = SslIoError(ssl, rc, "handshake");
  }
  return false;
}

}  // namespace kvtier
