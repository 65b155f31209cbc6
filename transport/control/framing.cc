#include "transport/control/framing.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "transport/control/socket.h"

namespace wsync {
namespace {

// Largest single read of a body: keeps one connection from monopolizing an event loop turn.
constexpr int64_t kMaxReadChunk = int64_t{1} << 20;

absl::Status IoError(absl::string_view what, int error) {
  if (error == ECONNRESET || error == EPIPE || error == ENOTCONN || error == ETIMEDOUT) {
    return absl::UnavailableError(
        absl::StrCat("control: connection lost (", what, ": ", std::strerror(error), ")"));
  }
  return absl::InternalError(absl::StrCat("control: ", what, ": ", std::strerror(error)));
}

}  // namespace

absl::Status CheckFrameCap(int64_t max_frame_bytes) {
  if (max_frame_bytes <= 0 || max_frame_bytes > kMaxFrameBytesLimit) {
    return absl::InvalidArgumentError(absl::StrCat("control: frame cap ", max_frame_bytes,
                                                   " out of range (1..", kMaxFrameBytesLimit, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> EncodeFrame(const control::Frame& frame, int64_t max_frame_bytes) {
  const size_t body = frame.ByteSizeLong();
  if (static_cast<int64_t>(body) > max_frame_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "control: frame of ", body, " bytes exceeds the cap of ", max_frame_bytes, " bytes"));
  }
  std::string out(kFrameHeaderBytes + body, '\0');
  out[0] = static_cast<char>((body >> 24) & 0xff);
  out[1] = static_cast<char>((body >> 16) & 0xff);
  out[2] = static_cast<char>((body >> 8) & 0xff);
  out[3] = static_cast<char>(body & 0xff);
  if (body > 0 && !frame.SerializeToArray(out.data() + kFrameHeaderBytes, static_cast<int>(body))) {
    return absl::InternalError("control: cannot serialize a frame");
  }
  return out;
}

absl::StatusOr<control::Frame> DecodeFrameBody(absl::string_view body) {
  control::Frame frame;
  if (!frame.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return absl::DataLossError(
        absl::StrCat("control: malformed frame (", body.size(), " bytes do not parse)"));
  }
  if (frame.kind_case() == control::Frame::KIND_NOT_SET) {
    return absl::DataLossError("control: malformed frame (no message kind)");
  }
  return frame;
}

absl::StatusOr<bool> FrameReader::ReadSome(int fd) {
  for (;;) {
    if (body_bytes_ >= 0 && body_read_ == body_bytes_) return true;
    char* target;
    int64_t want;
    if (body_bytes_ < 0) {
      target = reinterpret_cast<char*>(header_) + header_read_;
      want = kFrameHeaderBytes - header_read_;
    } else {
      target = body_.data() + body_read_;
      want = std::min(body_bytes_ - body_read_, kMaxReadChunk);
    }
    const ssize_t got = recv(fd, target, static_cast<size_t>(want), 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      return IoError("recv", errno);
    }
    if (got == 0) {
      if (header_read_ == 0) return absl::UnavailableError("control: connection closed by peer");
      return absl::DataLossError(absl::StrCat("control: truncated frame: the peer closed after ",
                                              body_bytes_ < 0 ? header_read_ : body_read_, " of ",
                                              body_bytes_ < 0 ? kFrameHeaderBytes : body_bytes_,
                                              body_bytes_ < 0 ? " header bytes" : " body bytes"));
    }
    if (progress_ != nullptr) progress_->fetch_add(got, std::memory_order_relaxed);
    if (body_bytes_ < 0) {
      header_read_ += got;
      if (header_read_ < kFrameHeaderBytes) continue;
      const uint64_t length = (uint64_t{header_[0]} << 24) | (uint64_t{header_[1]} << 16) |
                              (uint64_t{header_[2]} << 8) | uint64_t{header_[3]};
      if (static_cast<int64_t>(length) > max_frame_bytes_) {
        // Refused before any allocation for the body.
        return absl::ResourceExhaustedError(absl::StrCat("control: frame of ", length,
                                                         " bytes exceeds the cap of ",
                                                         max_frame_bytes_, " bytes"));
      }
      body_bytes_ = static_cast<int64_t>(length);
      body_read_ = 0;
      body_.resize(static_cast<size_t>(body_bytes_));
    } else {
      body_read_ += got;
    }
  }
}

absl::StatusOr<control::Frame> FrameReader::TakeFrame() {
  if (body_bytes_ < 0 || body_read_ != body_bytes_) {
    return absl::FailedPreconditionError("control: no complete frame buffered");
  }
  absl::StatusOr<control::Frame> frame = DecodeFrameBody(body_);
  header_read_ = 0;
  body_bytes_ = -1;
  body_read_ = 0;
  std::string().swap(body_);  // Releases the body's memory between frames.
  return frame;
}

void FrameWriter::Enqueue(std::shared_ptr<const std::string> encoded) {
  if (encoded == nullptr || encoded->empty()) return;
  pending_bytes_ += static_cast<int64_t>(encoded->size());
  queue_.push_back(std::move(encoded));
}

absl::StatusOr<bool> FrameWriter::Flush(int fd) {
  while (!queue_.empty()) {
    const std::string& front = *queue_.front();
    const ssize_t sent = send(fd, front.data() + offset_, front.size() - offset_, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      return IoError("send", errno);
    }
    offset_ += sent;
    pending_bytes_ -= sent;
    if (offset_ == static_cast<int64_t>(front.size())) {
      queue_.pop_front();
      offset_ = 0;
    }
  }
  return true;
}

absl::StatusOr<control::Frame> ReadFrame(int fd, FrameReader& reader, absl::Time deadline) {
  for (;;) {
    WSYNC_ASSIGN_OR_RETURN(const bool complete, reader.ReadSome(fd));
    if (complete) return reader.TakeFrame();
    if (absl::Status ready = PollOne(fd, POLLIN, deadline); !ready.ok()) {
      if (absl::IsDeadlineExceeded(ready)) {
        return absl::DeadlineExceededError(reader.mid_frame()
                                               ? "control: deadline passed in the middle of a frame"
                                               : "control: no frame arrived before the deadline");
      }
      return ready;
    }
  }
}

absl::Status FlushFrames(int fd, FrameWriter& writer, absl::Time deadline) {
  for (;;) {
    WSYNC_ASSIGN_OR_RETURN(const bool done, writer.Flush(fd));
    if (done) return absl::OkStatus();
    if (absl::Status ready = PollOne(fd, POLLOUT, deadline); !ready.ok()) {
      if (absl::IsDeadlineExceeded(ready)) {
        return absl::DeadlineExceededError(absl::StrCat("control: the peer did not take ",
                                                        writer.pending_bytes(),
                                                        " bytes before the deadline"));
      }
      return ready;
    }
  }
}

absl::Status WriteFrame(int fd, FrameWriter& writer, const control::Frame& frame,
                        int64_t max_frame_bytes, absl::Time deadline) {
  WSYNC_ASSIGN_OR_RETURN(std::string encoded, EncodeFrame(frame, max_frame_bytes));
  writer.Enqueue(std::make_shared<const std::string>(std::move(encoded)));
  return FlushFrames(fd, writer, deadline);
}

}  // namespace wsync
