#include "lane.h"

#include <cstring>
#include <utility>

#include "compress.h"
#include "convert.h"
#include "wire.h"

namespace rackhub::client::internal {

// Frames per gather write (two buffers each; IOV_MAX is 1024).
constexpr size_t kMaxFramesPerWrite = 64;

Lane::Lane(Client::Impl* owner, uint32_t index, tcp::socket socket)
    : owner_(owner), index_(index), socket_(std::move(socket)) {}

void Lane::StartReading() { ReadHeader(); }

void Lane::Expect(uint64_t request_id, PendingRequest request) {
  pending_.emplace(request_id, std::move(request));
}

void Lane::Send(OutFrame frame) {
  if (!open_ || closing_) {
    Release(frame);
    return;
  }
  queue_.push_back(std::move(frame));
  WriteNext();
}

void Lane::SendByeAndClose() {
  if (!open_ || closing_) return;
  OutFrame bye;
  net::FrameHeader h;
  h.opcode = net::Opcode::kBye;
  h.tenant = owner_->tenant_handle();
  net::EncodeHeader(h, bye.header);
  queue_.push_back(std::move(bye));
  closing_ = true;
  WriteNext();
}

void Lane::Abort() {
  if (!open_) return;
  open_ = false;
  boost::system::error_code ignored;
  socket_.close(ignored);
  // The frames being written (if any) are released by the write's handler.
  const size_t keep = in_flight_;
  while (queue_.size() > keep) {
    Release(queue_.back());
    queue_.pop_back();
  }
  pending_.clear();  // their operations are failed by the owner
  owner_->LaneClosed();
}

void Lane::CloseSocket() {
  if (!open_) return;
  open_ = false;
  boost::system::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  pending_.clear();
  owner_->LaneClosed();
}

void Lane::Release(OutFrame& frame) {
  if (frame.borrows_user && frame.op) owner_->ReleaseIo(frame.op);
  frame.borrows_user = false;
  frame.op.reset();
}

void Lane::WriteNext() {
  if (in_flight_ > 0) return;
  // Frames of operations that already failed are not sent (their caller may
  // reuse the buffers as soon as the ticket completes).
  while (!queue_.empty() && queue_.front().op && queue_.front().op->failed) {
    Release(queue_.front());
    queue_.pop_front();
  }
  if (queue_.empty() || !open_) {
    if (closing_) CloseSocket();
    return;
  }
  // One gather write for a run of sendable frames: header + payload each.
  std::vector<asio::const_buffer> buffers;
  while (in_flight_ < queue_.size() && in_flight_ < kMaxFramesPerWrite) {
    const OutFrame& f = queue_[in_flight_];
    if (f.op && f.op->failed) break;
    buffers.push_back(asio::buffer(f.header));
    if (f.bytes > 0) buffers.emplace_back(f.payload, f.bytes);
    ++in_flight_;
  }
  asio::async_write(socket_, buffers, [this](const boost::system::error_code& ec, size_t) {
    for (size_t i = 0; i < in_flight_; ++i) {
      OutFrame done = std::move(queue_.front());
      queue_.pop_front();
      Release(done);
    }
    in_flight_ = 0;
    if (ec) {
      IoFailed(ec, "sending a frame");
      return;
    }
    WriteNext();
  });
}

void Lane::ReadHeader() {
  if (!open_) return;
  asio::async_read(socket_, asio::buffer(header_bytes_),
                   [this](const boost::system::error_code& ec, size_t) {
                     if (ec) {
                       IoFailed(ec, "reading a frame header");
                       return;
                     }
                     OnHeader();
                   });
}

void Lane::OnHeader() {
  header_ = net::DecodeHeader(header_bytes_);
  if (const Status bad = net::CheckHeader(header_); !bad.ok()) {
    Broken("invalid frame header from the hub: " + bad.message());
    return;
  }
  const net::Opcode op = header_.opcode;
  if (op == net::Opcode::kError || op == net::Opcode::kHeartbeat) {
    scratch_.resize(header_.payload_bytes);
    ReadPayloadInto(scratch_.data(), scratch_.size(), false, PendingRequest{});
    return;
  }
  if (op != net::Opcode::kParams && op != net::Opcode::kAck && op != net::Opcode::kKeyInfo &&
      op != net::Opcode::kRows) {
    Broken(std::string("unexpected ") + net::OpcodeName(op) + " frame from the hub");
    return;
  }
  const auto it = pending_.find(header_.request_id);
  if (it == pending_.end()) {
    Broken(std::string(net::OpcodeName(op)) + " answers unknown request id " +
           std::to_string(header_.request_id));
    return;
  }
  PendingRequest request = std::move(it->second);
  pending_.erase(it);
  const Operation& o = *request.op;
  const auto what = [&] {
    return std::string(net::OpcodeName(op)) + " for request " + std::to_string(header_.request_id) +
           " (" + OpKindName(o.kind) + " of key " + std::to_string(o.key) + ")";
  };
  if (op != request.expect) {
    Broken(what() + ": expected " + net::OpcodeName(request.expect));
    return;
  }
  if (op == net::Opcode::kParams) {
    if (header_.key != o.key || header_.chunk != request.chunk) {
      Broken(what() + " names key " + std::to_string(header_.key) + " chunk " +
             std::to_string(header_.chunk) + ", expected chunk " + std::to_string(request.chunk));
      return;
    }
    const size_t want = size_t{request.elements} * net::DTypeBytes(WireDType(o.dtype));
    if (header_.payload_bytes == 0 && o.kind == OpKind::kInit) {  // bare acknowledgement
      OnReply(request);
      ReadHeader();
      return;
    }
    const size_t suffix = (header_.flags & net::kFlagVersions) ? net::kVersionsSuffixBytes : 0;
    const bool sparse = (header_.flags & net::kFlagSparse) != 0;
    if (sparse && header_.payload_bytes <= want) {
      // Read whole, then checked and scattered by StoreSparseParams (OnReply).
      scratch_.resize(header_.payload_bytes);
      ReadPayloadInto(scratch_.data(), scratch_.size(), false, std::move(request));
      return;
    }
    if (sparse || header_.dtype != WireDType(o.dtype) || header_.payload_bytes != want + suffix) {
      Broken(what() + ": " + std::to_string(header_.payload_bytes) + " bytes of " +
             net::DTypeName(header_.dtype) + ", expected " + std::to_string(want) + " bytes of " +
             net::DTypeName(WireDType(o.dtype)));
      return;
    }
    const bool store =
        !o.failed && (o.kind == OpKind::kPushPull || o.kind == OpKind::kPull);
    if (store && o.dtype == DType::kFp32 && suffix == 0) {
      // fp32: straight into the caller's buffer at the chunk's offset.
      float* dest = request.op->out.data() + request.offset;
      ReadPayloadInto(dest, want, true, std::move(request));
      return;
    }
  } else if (header_.key != o.key && o.kind != OpKind::kDeclare) {
    Broken(what() + " names key " + std::to_string(header_.key));
    return;
  }
  // ROWS: read whole, then checked and scattered by StoreRows (OnReply).
  scratch_.resize(header_.payload_bytes);
  ReadPayloadInto(scratch_.data(), scratch_.size(), false, std::move(request));
}

void Lane::ReadPayloadInto(void* dest, size_t bytes, bool direct, PendingRequest request) {
  if (direct) ++request.op->io_refs;
  asio::async_read(
      socket_, asio::buffer(dest, bytes),
      [this, direct, request = std::move(request)](const boost::system::error_code& ec, size_t) {
        if (ec) {
          if (direct) owner_->ReleaseIo(request.op);
          IoFailed(ec, "reading a frame payload");
          return;
        }
        switch (header_.opcode) {
          case net::Opcode::kError: OnError(); break;
          case net::Opcode::kHeartbeat: break;
          default: OnReply(request); break;
        }
        if (direct) owner_->ReleaseIo(request.op);
        ReadHeader();
      });
}

void Lane::OnReply(const PendingRequest& request) {
  const OperationPtr& op = request.op;
  if (op->failed || op->finished) return;  // late reply of a failed ticket: dropped
  if (header_.opcode == net::Opcode::kParams && (header_.flags & net::kFlagSparse)) {
    if (const Status st = StoreSparseParams(header_, scratch_, request); !st.ok()) {
      Broken(st.message());
      return;
    }
  } else if (header_.opcode == net::Opcode::kParams && header_.payload_bytes > 0 &&
             (op->kind == OpKind::kPushPull || op->kind == OpKind::kPull)) {
    // (fp32 without a suffix was read straight into `out`.)
    float* dest = op->out.data() + request.offset;
    if (op->dtype != DType::kFp32) {
      WidenToFloats(op->dtype, scratch_.data(), dest, request.elements);
    } else if (header_.flags & net::kFlagVersions) {
      std::memcpy(dest, scratch_.data(), size_t{request.elements} * 4);
    }
  }
  if (header_.opcode == net::Opcode::kParams && (header_.flags & net::kFlagVersions)) {
    const size_t want = size_t{request.elements} * net::DTypeBytes(WireDType(op->dtype));
    owner_->VersionsArrived(op, ReadVersions(std::span<const std::byte>(scratch_).subspan(want)));
  }
  if (header_.opcode == net::Opcode::kRows) {
    if (const Status s = StoreRows(header_, scratch_, request); !s.ok()) {
      Broken(s.message());
      return;
    }
  }
  if (header_.opcode == net::Opcode::kKeyInfo) {
    data::v1::KeyEntry entry;
    if (!entry.ParseFromArray(scratch_.data(), static_cast<int>(scratch_.size()))) {
      Broken("KEY_INFO payload is not a KeyEntry");
      return;
    }
    Result<KeyInfo> info = ToKeyInfo(entry, owner_->chunk_elements());
    if (!info.ok()) {
      Broken("KEY_INFO: " + info.status().message());
      return;
    }
    op->declared = *std::move(info);
  }
  owner_->ReplyArrived(op, header_.iteration);
}

void Lane::OnError() {
  if (const Status s = HandleErrorFrame(owner_, index_, header_, scratch_, &pending_); !s.ok()) {
    Broken(s.message(), s.code() != StatusCode::kFailedPrecondition);
  }
}

void Lane::Broken(const std::string& reason, bool reconnectable) {
  owner_->ConnectionLost("lane " + std::to_string(index_) + ": " + reason, reconnectable);
}

void Lane::IoFailed(const boost::system::error_code& ec, const char* what) {
  if (!open_ || closing_ || owner_->closing()) return;  // we closed it ourselves
  const std::string why = ec == asio::error::eof ? std::string("the hub closed the connection")
                                                 : ec.message();
  Broken(why + " while " + what);
}

}  // namespace rackhub::client::internal
