#include "control/status_client.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "control/auth.h"
#include "control/framing.h"
#include "control/protocol.h"
#include "control/socket.h"

namespace wsync {

absl::StatusOr<control::JobStatusBody> QueryJobStatus(const StatusQuery& query) {
  const std::string where =
      absl::StrCat("status of job '", query.job_id, "' from ", query.host, ":", query.port, ": ");
  auto failed = [&](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat(where, status.message()));
  };
  absl::StatusOr<UniqueFd> fd = ConnectTcp(query.host, query.port, query.deadline);
  if (!fd.ok()) return failed(fd.status());
  FrameReader reader(kDefaultMaxFrameBytes);
  FrameWriter writer;
  absl::StatusOr<control::Frame> challenge = ReadFrame(fd->get(), reader, query.deadline);
  if (!challenge.ok()) return failed(challenge.status());
  if (!challenge->has_challenge() || challenge->challenge().nonce().size() != kNonceBytes ||
      challenge->challenge().protocol_version() != kControlProtocolVersion) {
    return failed(absl::FailedPreconditionError(absl::StrCat(
        "the coordinator did not send a challenge of protocol version ", kControlProtocolVersion)));
  }
  const std::string nonce = challenge->challenge().nonce();
  absl::StatusOr<std::string> client_nonce = RandomBytes(kNonceBytes);
  if (!client_nonce.ok()) return failed(client_nonce.status());
  control::Frame request;
  control::StatusRequest* ask = request.mutable_status_request();
  ask->set_job_id(query.job_id);
  ask->set_client_nonce(*client_nonce);
  ask->set_mac(StatusRequestMac(query.secret, nonce, *client_nonce, query.job_id));
  if (absl::Status sent =
          WriteFrame(fd->get(), writer, request, kDefaultMaxFrameBytes, query.deadline);
      !sent.ok()) {
    return failed(sent);
  }
  absl::StatusOr<control::Frame> answer = ReadFrame(fd->get(), reader, query.deadline);
  if (!answer.ok()) return failed(answer.status());
  if (answer->has_reject()) {
    return failed(StatusFromWire(
        answer->reject().code(),
        absl::StrCat("the coordinator refused the query: ", answer->reject().reason())));
  }
  if (!answer->has_job_status()) {
    return failed(absl::InternalError("the coordinator answered with another frame"));
  }
  const control::JobStatus& status = answer->job_status();
  if (!ConstantTimeEquals(StatusReplyMac(query.secret, *client_nonce, nonce, status.body()),
                          status.mac())) {
    return failed(absl::UnauthenticatedError(
        "the answer's MAC is wrong: the coordinator does not hold the job secret"));
  }
  control::JobStatusBody body;
  if (!body.ParseFromString(status.body())) {
    return failed(absl::InternalError("the answer's body does not parse"));
  }
  return body;
}

}  // namespace wsync
