#include "control/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "control/socket.h"

namespace wsync {

void AppendU32(std::string& out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(value >> shift));
}

void AppendField(std::string& out, absl::string_view field) {
  AppendU32(out, static_cast<uint32_t>(field.size()));
  out.append(field.data(), field.size());
}

namespace {

// Removes one trailing "\n" or "\r\n".
void TrimNewline(std::string& text) {
  if (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty() && text.back() == '\r') text.pop_back();
}

absl::StatusOr<std::string> LoadSecretFile(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) {
    const int error = errno;
    const std::string text =
        absl::StrCat("control: cannot open the secret file ", path, ": ", std::strerror(error));
    if (error == ENOENT) return absl::NotFoundError(text);
    return absl::PermissionDeniedError(text);
  }
  // Checked on the opened descriptor, so the file cannot be swapped between check and read.
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    return absl::InternalError(absl::StrCat("control: cannot stat the secret file ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::PermissionDeniedError(
        absl::StrCat("control: the secret file ", path, " is not a regular file"));
  }
  if (st.st_uid != geteuid()) {
    return absl::PermissionDeniedError(absl::StrCat("control: the secret file ", path,
                                                    " is owned by uid ", st.st_uid,
                                                    ", not by this process's uid ", geteuid()));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "control: the secret file %s has mode %04o; it must not be readable or writable by group "
        "or others (use chmod 600)",
        path, st.st_mode & 07777));
  }
  if (st.st_size > kMaxSecretBytes + 2) {
    return absl::InvalidArgumentError(absl::StrCat("control: the secret file ", path,
                                                   " is larger than ", kMaxSecretBytes, " bytes"));
  }
  std::string secret(static_cast<size_t>(kMaxSecretBytes + 3), '\0');
  size_t total = 0;
  while (total < secret.size()) {
    const ssize_t got = read(fd.get(), secret.data() + total, secret.size() - total);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      WipeSecret(secret);
      return absl::InternalError(absl::StrCat("control: cannot read the secret file ", path));
    }
    if (got == 0) break;
    total += static_cast<size_t>(got);
  }
  // Shrinking in place keeps the bytes in this one buffer (no copy left behind unwiped).
  secret.resize(total);
  TrimNewline(secret);
  if (absl::Status ok = CheckSecret(secret); !ok.ok()) {
    WipeSecret(secret);
    return absl::InvalidArgumentError(
        absl::StrCat("control: the secret in ", path, " is unusable: ", ok.message()));
  }
  return secret;
}

}  // namespace

absl::Status CheckSecret(absl::string_view secret) {
  if (static_cast<int64_t>(secret.size()) < kMinSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a secret needs at least ", kMinSecretBytes, " bytes"));
  }
  if (static_cast<int64_t>(secret.size()) > kMaxSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a secret may have at most ", kMaxSecretBytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> LoadSecret(const SecretSource& source) {
  if (source.kind == SecretSource::Kind::kValue) {
    if (absl::Status ok = CheckSecret(source.value); !ok.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("control: the secret given is unusable: ", ok.message()));
    }
    return std::string(source.value);
  }
  if (source.name.empty()) {
    return absl::InvalidArgumentError("control: the secret source names no file or variable");
  }
  if (source.kind == SecretSource::Kind::kFile) return LoadSecretFile(source.name);
  std::string secret;
  {
    static absl::Mutex environment_mu(absl::kConstInit);
    absl::MutexLock lock(&environment_mu);
    const char* value = std::getenv(source.name.c_str());
    if (value == nullptr) {
      return absl::NotFoundError(absl::StrCat("control: the secret variable ", source.name,
                                              " is not set (or was read and removed already)"));
    }
    secret = value;
    unsetenv(source.name.c_str());
  }
  TrimNewline(secret);
  if (absl::Status ok = CheckSecret(secret); !ok.ok()) {
    WipeSecret(secret);
    return absl::InvalidArgumentError(absl::StrCat("control: the secret in the variable ",
                                                   source.name, " is unusable: ", ok.message()));
  }
  return secret;
}

std::string HmacSha256(absl::string_view key, absl::string_view message) {
  unsigned char tag[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  // An empty key or message is valid for HMAC; pass non-null pointers for both.
  static const unsigned char kEmpty = 0;
  const void* key_data = key.empty() ? &kEmpty : static_cast<const void*>(key.data());
  const auto* data =
      message.empty() ? &kEmpty : reinterpret_cast<const unsigned char*>(message.data());
  if (HMAC(EVP_sha256(), key_data, static_cast<int>(key.size()), data, message.size(), tag,
           &length) == nullptr ||
      length != kMacBytes) {
    return std::string();  // Never equal to a real tag: verification then fails closed.
  }
  std::string out(reinterpret_cast<const char*>(tag), length);
  OPENSSL_cleanse(tag, sizeof(tag));
  return out;
}

absl::StatusOr<std::string> RandomBytes(int64_t count) {
  std::string out(static_cast<size_t>(count), '\0');
  if (count > 0 &&
      RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(count)) != 1) {
    return absl::InternalError("control: the random generator failed");
  }
  return out;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string HelloMac(absl::string_view secret, absl::string_view nonce,
                     absl::string_view client_nonce, absl::string_view job_id, ControlRole role,
                     int32_t rank, absl::string_view node_id) {
  std::string message;
  AppendField(message, "wsync-control-hello-v1");
  AppendField(message, nonce);
  AppendField(message, client_nonce);
  AppendField(message, job_id);
  AppendU32(message, static_cast<uint32_t>(role));
  AppendU32(message, static_cast<uint32_t>(rank));
  AppendField(message, node_id);
  return HmacSha256(secret, message);
}

std::string WelcomeMac(absl::string_view secret, absl::string_view client_nonce,
                       absl::string_view nonce, absl::string_view job_id,
                       const WelcomeFields& fields) {
  std::string message;
  AppendField(message, "wsync-control-welcome-v2");
  AppendField(message, client_nonce);
  AppendField(message, nonce);
  AppendField(message, job_id);
  AppendU32(message, static_cast<uint32_t>(fields.process));
  AppendU32(message, static_cast<uint32_t>(fields.num_trainers));
  AppendU32(message, static_cast<uint32_t>(fields.num_rollouts));
  for (int64_t value :
       {fields.max_frame_bytes, fields.heartbeat_interval_ms, fields.silence_limit_ms}) {
    AppendU32(message, static_cast<uint32_t>(static_cast<uint64_t>(value) >> 32));
    AppendU32(message, static_cast<uint32_t>(value));
  }
  return HmacSha256(secret, message);
}

std::string StatusRequestMac(absl::string_view secret, absl::string_view nonce,
                             absl::string_view client_nonce, absl::string_view job_id) {
  std::string message;
  AppendField(message, "wsync-control-status-v1");
  AppendField(message, nonce);
  AppendField(message, client_nonce);
  AppendField(message, job_id);
  return HmacSha256(secret, message);
}

std::string StatusReplyMac(absl::string_view secret, absl::string_view client_nonce,
                           absl::string_view nonce, absl::string_view body) {
  std::string message;
  AppendField(message, "wsync-control-status-reply-v1");
  AppendField(message, client_nonce);
  AppendField(message, nonce);
  AppendField(message, body);
  return HmacSha256(secret, message);
}

void WipeSecret(std::string& text) {
  if (!text.empty()) OPENSSL_cleanse(text.data(), text.size());
  text.clear();
}

}  // namespace wsync
