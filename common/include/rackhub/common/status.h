// Status and Result<T>: the one error vocabulary of rackhub.
//
// What: a Status is OK or an error code with a message; a Result<T> holds
// either a T or a non-OK Status. Functions that can fail return one of them
// (never "" for success, never bool plus a std::string* error out-parameter).
//
// Contract:
//  - A message starts with the offending field, option or input, then says
//    what is wrong: "admin.listen: port '99999' is not a number in 0..65535",
//    "--bytes: '12XB' has an unknown unit 'XB'". A value parser that does not
//    know its field starts with the quoted input; its caller puts the field in
//    front (Status::WithContext). No trailing period, no newline.
//  - StatusCode values equal the gRPC status codes one to one, so
//    grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message()) is
//    an exact conversion.
//
// Ownership and threads: plain values (copyable, movable, no shared state);
// use them from any thread. Result<T>::value() on an error Result is a bug: it
// prints the status and aborts.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace rackhub {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,  // gave up waiting (e.g. for a consistent iteration)
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,        // an operation was interrupted by a concurrent change
  kUnimplemented = 12,  // not supported (yet) in this configuration
  kInternal = 13,
  kUnavailable = 14,  // a peer or connection is gone (retrying elsewhere/later may work)
  kUnauthenticated = 16,
};

// "OK", "INVALID_ARGUMENT", ... (the gRPC spelling).
const char* StatusCodeName(StatusCode code);

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // The same code with "context: " in front of the message (OK stays OK):
  // InvalidArgument("'x' is not a size").WithContext("--bytes").
  Status WithContext(std::string_view context) const;
  // "OK" or "INVALID_ARGUMENT: message".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status PermissionDenied(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Unauthenticated(std::string m) {
  return {StatusCode::kUnauthenticated, std::move(m)};
}

namespace internal {
// Prints `status` and what was attempted to stderr, then aborts.
[[noreturn]] void DieOnBadResultAccess(const Status& status);
}  // namespace internal

// A T or the non-OK Status saying why there is none. Implicitly constructible
// from a T (anything T can be built from) and from a non-OK Status, so a
// function returning Result<T> can `return value;` and `return NotFound(...);`.
// Building one from an OK Status is a bug and yields an INTERNAL error.
template <class T>
class Result {
  static_assert(!std::is_same_v<std::remove_cv_t<T>, Status>, "Result<Status>: use Status");
  static_assert(!std::is_reference_v<T>, "Result<T&> is not supported");

 public:
  template <class U = T>
    requires(std::is_constructible_v<T, U &&> &&
             !std::is_same_v<std::remove_cvref_t<U>, Result> &&
             !std::is_same_v<std::remove_cvref_t<U>, Status>)
  Result(U&& value) : value_(std::in_place, std::forward<U>(value)) {}  // NOLINT: implicit

  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit
    if (status_.ok()) status_ = Internal("Result: built from an OK status without a value");
  }

  bool ok() const { return value_.has_value(); }
  // OK when a value is held.
  const Status& status() const& { return status_; }
  Status status() && { return std::move(status_); }

  // REQUIRES: ok() (otherwise prints the status and aborts).
  T& value() & {
    Check();
    return *value_;
  }
  const T& value() const& {
    Check();
    return *value_;
  }
  T&& value() && {
    Check();
    return std::move(*value_);
  }
  template <class U>
  T value_or(U&& fallback) const& {
    return ok() ? *value_ : static_cast<T>(std::forward<U>(fallback));
  }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void Check() const {
    if (!value_.has_value()) internal::DieOnBadResultAccess(status_);
  }

  Status status_;  // OK iff value_ is set
  std::optional<T> value_;
};

}  // namespace rackhub
