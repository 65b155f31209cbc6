#ifndef WSYNC_CONTROL_FRAMING_H_
#define WSYNC_CONTROL_FRAMING_H_

// Length-prefixed frames over a non-blocking stream socket. Wire layout of one frame:
//   unsealed (the handshake: Challenge, Hello, Welcome, a Reject before the Welcome, and the
//   `wsync status` exchange):  be32(L) | body            with L = body length
//   sealed (every later frame of a coordinator<->client connection):
//                              be32(L) | body | tag      with L = body length + kFrameTagBytes
// where body is a serialized control::Frame and tag is frame_seal.h's HMAC over the frame's
// sequence number, body length and body digest. A writer seals and a reader opens once Seal /
// Open gave them the connection's keys (channel_keys.h: SealChannel). Lengths above the reader's
// cap (plus the tag, when sealed) are refused before any memory is allocated for the body; a sealed
// body is checked before it is parsed, and an unauthenticated body is never parsed.
//
// FrameReader and FrameWriter keep partial progress between calls, so a deadline that passes in
// the middle of a frame leaves the stream aligned: the next call continues where the last stopped.
// The event-driven coordinator calls ReadSome / Flush when poll reports readiness; clients use the
// blocking helpers ReadFrame / WriteFrame, which wait with a deadline.
//
// Errors (absl codes, also relied on by callers and tests):
//   ResourceExhausted  a length above the cap (reading) or a frame above the cap (writing)
//   DataLoss           the peer closed in the middle of a frame (truncated), or a body that does
//                      not parse as a Frame or sets none of its kinds
//   Unauthenticated    a sealed frame whose tag is wrong for its sequence number (FrameOpener)
//   Unavailable        the peer closed at a frame boundary, or the connection failed (reset)
//   DeadlineExceeded   the deadline of a blocking helper passed
//
// Thread safety: a reader or writer is used by one thread at a time.

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "control/control.pb.h"
#include "control/frame_seal.h"

namespace wsync {

inline constexpr int64_t kFrameHeaderBytes = 4;
// Default cap on a frame body: manifests of the largest models' layouts are around 10 MB.
inline constexpr int64_t kDefaultMaxFrameBytes = int64_t{64} << 20;
// No cap may exceed this (protobuf refuses messages of 2 GiB and more).
inline constexpr int64_t kMaxFrameBytesLimit = int64_t{1} << 30;
// What one frame puts on the wire besides its body, at most (header and seal tag).
inline constexpr int64_t kMaxFrameOverheadBytes = kFrameHeaderBytes + kFrameTagBytes;

// OK when 0 < max_frame_bytes <= kMaxFrameBytesLimit.
absl::Status CheckFrameCap(int64_t max_frame_bytes);

// Header and body of `frame`; ResourceExhausted when the body exceeds `max_frame_bytes`.
absl::StatusOr<std::string> EncodeFrame(const control::Frame& frame, int64_t max_frame_bytes);

// Parses a frame body. DataLoss when it does not parse or sets no kind.
absl::StatusOr<control::Frame> DecodeFrameBody(absl::string_view body);

// One encoded frame, ready to be queued on one or many connections (shared, immutable).
struct OutgoingFrame {
  std::string encoded;      // EncodeFrame's output: the unsealed layout (header, body).
  FrameDigest body_digest;  // SHA-256 of the body, for the tags of sealing writers.

  absl::string_view body() const {
    return absl::string_view(encoded).substr(static_cast<size_t>(kFrameHeaderBytes));
  }
};

// EncodeFrame, and the body's digest (one hash, however many connections the frame goes to).
absl::StatusOr<std::shared_ptr<const OutgoingFrame>> PrepareFrame(const control::Frame& frame,
                                                                  int64_t max_frame_bytes);

class FrameReader {
 public:
  explicit FrameReader(int64_t max_frame_bytes) : max_frame_bytes_(max_frame_bytes) {}

  // Applies to frames whose header has not been read yet.
  void set_max_frame_bytes(int64_t max_frame_bytes) { max_frame_bytes_ = max_frame_bytes; }
  int64_t max_frame_bytes() const { return max_frame_bytes_; }

  // Reads what the non-blocking `fd` has, never past the end of the current frame. True once a
  // whole frame is buffered (take it with TakeFrame before reading on); false when the socket has
  // no more bytes for now. Errors as listed above; after an error the reader is unusable.
  absl::StatusOr<bool> ReadSome(int fd);

  // Decodes the buffered frame and resets for the next one. Call only after ReadSome returned
  // true. When opening, the tag is checked first: Unauthenticated (the body is not parsed), after
  // which the reader is unusable (every later call fails the same way).
  absl::StatusOr<control::Frame> TakeFrame();

  // Every frame whose header has not been read yet is sealed: checked with `opener` (not null)
  // before it is parsed. Call once, at the end of the handshake.
  void Open(std::unique_ptr<FrameOpener> opener) { opener_ = std::move(opener); }
  bool opening() const { return opener_ != nullptr; }

  // Every byte ReadSome receives from now on is also added to `*counter` (relaxed), which another
  // thread may read to see that the peer is sending (a liveness check). Null: none. The counter
  // must outlive the reader's use.
  void set_progress_counter(std::atomic<int64_t>* counter) { progress_ = counter; }

  // True when part of a frame (some header or body bytes) has arrived.
  bool mid_frame() const { return header_read_ > 0; }
  // Bytes reserved for the current body: 0 until a header within the cap arrived.
  int64_t allocated_bytes() const { return static_cast<int64_t>(body_.size()); }

 private:
  int64_t max_frame_bytes_;
  unsigned char header_[kFrameHeaderBytes] = {};
  int64_t header_read_ = 0;
  int64_t body_bytes_ = -1;  // -1 until the header is complete.
  int64_t body_read_ = 0;
  std::string body_;  // The body and, when opening, its tag.
  std::atomic<int64_t>* progress_ = nullptr;
  std::unique_ptr<FrameOpener> opener_;
  absl::Status failed_;  // Not OK after an authentication failure.
};

class FrameWriter {
 public:
  // Queues a frame; shared so that one roster or result can be queued to many connections without
  // copies of its body. When sealing, the frame gets this connection's header and tag (the next
  // sequence number is assigned here: frames go on the wire in the order they are queued).
  void Enqueue(std::shared_ptr<const OutgoingFrame> frame);
  // Queues bytes as they are, never sealed (a test's forged or replayed frame).
  void EnqueueUnsealed(std::shared_ptr<const std::string> bytes);

  // Every frame queued from now on is sealed with `sealer` (not null). Call once, at the end of
  // the handshake.
  void Seal(std::unique_ptr<FrameSealer> sealer) { sealer_ = std::move(sealer); }
  bool sealing() const { return sealer_ != nullptr; }

  // Writes as much as the non-blocking `fd` takes. True once the queue is empty. Unavailable when
  // the connection failed (never raises SIGPIPE).
  absl::StatusOr<bool> Flush(int fd);

  bool empty() const { return queue_.empty(); }
  int64_t pending_bytes() const { return pending_bytes_; }

 private:
  // Bytes [begin, end) of a shared string: a frame's body, or this connection's header or tag.
  struct Piece {
    std::shared_ptr<const std::string> owner;
    size_t begin = 0;
    size_t end = 0;
  };
  void Push(std::shared_ptr<const std::string> owner, size_t begin, size_t end);

  std::deque<Piece> queue_;
  size_t offset_ = 0;  // Bytes of queue_.front() already written.
  int64_t pending_bytes_ = 0;
  std::unique_ptr<FrameSealer> sealer_;
};

// Blocking helpers: wait with poll until the frame is read, or written, or `deadline` passes.
absl::StatusOr<control::Frame> ReadFrame(int fd, FrameReader& reader, absl::Time deadline);
absl::Status WriteFrame(int fd, FrameWriter& writer, const control::Frame& frame,
                        int64_t max_frame_bytes, absl::Time deadline);
// Writes what is queued.
absl::Status FlushFrames(int fd, FrameWriter& writer, absl::Time deadline);

}  // namespace wsync

#endif  // WSYNC_CONTROL_FRAMING_H_
