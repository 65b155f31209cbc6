#include "control/framing.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "control/socket.h"

namespace wsync {
namespace {

// Largest single read of a body: keeps one connection from monopolizing an event loop turn.
constexpr int64_t kMaxReadChunk = int64_t{1} << 20;
// Pieces given to one sendmsg (a sealed frame is three: header, body, tag).
constexpr size_t kMaxPiecesPerSend = 48;

std::string Header(uint64_t length) {
  return std::string{static_cast<char>((length >> 24) & 0xff),
                     static_cast<char>((length >> 16) & 0xff),
                     static_cast<char>((length >> 8) & 0xff), static_cast<char>(length & 0xff)};
}

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
  std::string out = Header(body);
  out.resize(kFrameHeaderBytes + body);
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

absl::StatusOr<std::shared_ptr<const OutgoingFrame>> PrepareFrame(const control::Frame& frame,
                                                                  int64_t max_frame_bytes) {
  WSYNC_ASSIGN_OR_RETURN(std::string encoded, EncodeFrame(frame, max_frame_bytes));
  auto prepared = std::make_shared<OutgoingFrame>();
  prepared->encoded = std::move(encoded);
  prepared->body_digest = DigestFrameBody(prepared->body());
  return std::shared_ptr<const OutgoingFrame>(std::move(prepared));
}

absl::StatusOr<bool> FrameReader::ReadSome(int fd) {
  if (!failed_.ok()) return failed_;
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
      const int64_t tag = opener_ != nullptr ? kFrameTagBytes : 0;
      if (static_cast<int64_t>(length) > max_frame_bytes_ + tag) {
        // Refused before any allocation for the body.
        return absl::ResourceExhaustedError(
            absl::StrCat("control: frame of ", static_cast<int64_t>(length) - tag,
                         " bytes exceeds the cap of ", max_frame_bytes_, " bytes"));
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
  if (!failed_.ok()) return failed_;
  absl::string_view body = body_;
  if (opener_ != nullptr) {
    // Checked before the body is parsed; a frame too short for a tag cannot be authentic.
    if (body.size() < static_cast<size_t>(kFrameTagBytes)) {
      failed_ = opener_->Refuse();
    } else {
      const size_t tagged = body.size() - static_cast<size_t>(kFrameTagBytes);
      failed_ = opener_->Open(body.substr(0, tagged), body.substr(tagged));
      body = body.substr(0, tagged);
    }
    if (!failed_.ok()) return failed_;
  }
  absl::StatusOr<control::Frame> frame = DecodeFrameBody(body);
  header_read_ = 0;
  body_bytes_ = -1;
  body_read_ = 0;
  std::string().swap(body_);  // Releases the body's memory between frames.
  return frame;
}

void FrameWriter::Push(std::shared_ptr<const std::string> owner, size_t begin, size_t end) {
  if (begin >= end) return;
  pending_bytes_ += static_cast<int64_t>(end - begin);
  queue_.push_back(Piece{std::move(owner), begin, end});
}

void FrameWriter::Enqueue(std::shared_ptr<const OutgoingFrame> frame) {
  if (frame == nullptr || frame->encoded.empty()) return;
  const size_t size = frame->encoded.size();
  std::shared_ptr<const std::string> encoded(frame, &frame->encoded);  // Shares the frame.
  if (sealer_ == nullptr) {
    Push(std::move(encoded), 0, size);
    return;
  }
  // This connection's header (counting the tag) and tag around the shared body.
  const uint64_t body = size - static_cast<size_t>(kFrameHeaderBytes);
  auto own = std::make_shared<std::string>(Header(body + kFrameTagBytes));
  own->append(sealer_->Seal(body, frame->body_digest));
  const std::shared_ptr<const std::string> ends = std::move(own);
  Push(ends, 0, kFrameHeaderBytes);
  Push(std::move(encoded), kFrameHeaderBytes, size);
  Push(ends, kFrameHeaderBytes, ends->size());
}

void FrameWriter::EnqueueUnsealed(std::shared_ptr<const std::string> bytes) {
  if (bytes == nullptr) return;
  const size_t size = bytes->size();
  Push(std::move(bytes), 0, size);
}

absl::StatusOr<bool> FrameWriter::Flush(int fd) {
  iovec pieces[kMaxPiecesPerSend];
  while (!queue_.empty()) {
    size_t count = 0;
    for (const Piece& piece : queue_) {
      if (count == kMaxPiecesPerSend) break;
      const size_t skip = count == 0 ? offset_ : 0;
      pieces[count].iov_base = const_cast<char*>(piece.owner->data() + piece.begin + skip);
      pieces[count].iov_len = piece.end - piece.begin - skip;
      ++count;
    }
    msghdr message{};
    message.msg_iov = pieces;
    message.msg_iovlen = count;
    ssize_t sent = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      return IoError("send", errno);
    }
    pending_bytes_ -= sent;
    while (sent > 0) {
      const size_t left = queue_.front().end - queue_.front().begin - offset_;
      if (static_cast<size_t>(sent) < left) {
        offset_ += static_cast<size_t>(sent);
        break;
      }
      sent -= static_cast<ssize_t>(left);
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
  WSYNC_ASSIGN_OR_RETURN(std::shared_ptr<const OutgoingFrame> prepared,
                         PrepareFrame(frame, max_frame_bytes));
  writer.Enqueue(std::move(prepared));
  return FlushFrames(fd, writer, deadline);
}

}  // namespace wsync
