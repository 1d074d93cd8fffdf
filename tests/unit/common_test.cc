// Unit tests for rackhub_common: Status, Result<T>, the size syntax
// (ParseSize / FormatSize), strict numbers (ParseUnsigned / ParseDecimal) and
// SafeForLog (client text in logs and messages).

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rackhub/common/log_safe.h"
#include "rackhub/common/number.h"
#include "rackhub/common/size.h"
#include "rackhub/common/status.h"

namespace rackhub {
namespace {

// ---------------------------------------------------------------------------
// Status

TEST(StatusTest, DefaultIsOk) {
  const Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, HelpersSetTheirCode) {
  EXPECT_EQ(InvalidArgument("a").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NotFound("a").code(), StatusCode::kNotFound);
  EXPECT_EQ(AlreadyExists("a").code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(PermissionDenied("a").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(ResourceExhausted("a").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(FailedPrecondition("a").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Internal("a").code(), StatusCode::kInternal);
  EXPECT_EQ(Unavailable("a").code(), StatusCode::kUnavailable);
  EXPECT_EQ(Unauthenticated("a").code(), StatusCode::kUnauthenticated);
  EXPECT_FALSE(Internal("boom").ok());
  EXPECT_EQ(Internal("boom").message(), "boom");
}

TEST(StatusTest, CodesAreTheGrpcCodes) {
  // grpc::StatusCode values, spelled out: the admin API casts one into the other.
  EXPECT_EQ(static_cast<int>(StatusCode::kInvalidArgument), 3);
  EXPECT_EQ(static_cast<int>(StatusCode::kNotFound), 5);
  EXPECT_EQ(static_cast<int>(StatusCode::kAlreadyExists), 6);
  EXPECT_EQ(static_cast<int>(StatusCode::kPermissionDenied), 7);
  EXPECT_EQ(static_cast<int>(StatusCode::kResourceExhausted), 8);
  EXPECT_EQ(static_cast<int>(StatusCode::kFailedPrecondition), 9);
  EXPECT_EQ(static_cast<int>(StatusCode::kInternal), 13);
  EXPECT_EQ(static_cast<int>(StatusCode::kUnavailable), 14);
  EXPECT_EQ(static_cast<int>(StatusCode::kUnauthenticated), 16);
  EXPECT_STREQ(StatusCodeName(StatusCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
}

TEST(StatusTest, WithContextPrefixesTheMessage) {
  const Status s = InvalidArgument("'x' is not a size").WithContext("--bytes");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--bytes: 'x' is not a size");
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: --bytes: 'x' is not a size");
  EXPECT_TRUE(Status::Ok().WithContext("field").ok());
  EXPECT_EQ(Status::Ok().WithContext("field").message(), "");
}

// ---------------------------------------------------------------------------
// Result<T>

Result<int> Half(int v) {
  if (v % 2 != 0) return InvalidArgument(std::to_string(v) + " is odd");
  return v / 2;
}

TEST(ResultTest, HoldsAValue) {
  const Result<int> r = Half(8);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.status().ok());
  EXPECT_EQ(r.value(), 4);
  EXPECT_EQ(*r, 4);
  EXPECT_EQ(r.value_or(-1), 4);
}

TEST(ResultTest, HoldsAnError) {
  const Result<int> r = Half(7);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "7 is odd");
  EXPECT_EQ(r.value_or(-1), -1);
}

TEST(ResultTest, ImplicitFromConvertibleValues) {
  Result<std::string> s = "text";  // const char* -> std::string
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, "text");
  EXPECT_EQ(s->size(), 4u);
  s->append("!");
  EXPECT_EQ(s.value(), "text!");
  Result<uint64_t> n = 5;  // int -> uint64_t
  EXPECT_EQ(*n, 5u);
}

TEST(ResultTest, MoveOnlyValues) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(3);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(**r, 3);
  std::unique_ptr<int> taken = std::move(r).value();
  EXPECT_EQ(*taken, 3);
}

TEST(ResultTest, OkStatusWithoutValueIsAnInternalError) {
  const Result<int> r = Status::Ok();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(ResultTest, StatusCanBeMovedOut) {
  Result<std::vector<int>> r = NotFound("key: 'w' does not exist");
  const Status s = std::move(r).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "key: 'w' does not exist");
}

TEST(ResultDeathTest, ValueOfAnErrorAborts) {
  const Result<int> r = NotFound("nothing here");
  EXPECT_DEATH((void)r.value(), "NOT_FOUND: nothing here");
}

// ---------------------------------------------------------------------------
// ParseSize / FormatSize

uint64_t MustParseSize(const std::string& text) {
  const Result<uint64_t> r = ParseSize(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().message();
  return r.value_or(0);
}

std::string SizeError(const std::string& text) {
  const Result<uint64_t> r = ParseSize(text);
  EXPECT_FALSE(r.ok()) << text << " parsed as " << r.value_or(0);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << text;
  // The message starts with the offending text (the caller adds the field).
  EXPECT_EQ(r.status().message().rfind("'" + text + "'", 0), 0u) << r.status().message();
  return r.status().message();
}

TEST(ParseSizeTest, EverySuffix) {
  EXPECT_EQ(MustParseSize("0"), 0u);
  EXPECT_EQ(MustParseSize("32768"), 32768u);
  EXPECT_EQ(MustParseSize("100B"), 100u);
  EXPECT_EQ(MustParseSize("32K"), 32u << 10);
  EXPECT_EQ(MustParseSize("32KiB"), 32u << 10);
  EXPECT_EQ(MustParseSize("3M"), 3u << 20);
  EXPECT_EQ(MustParseSize("3MiB"), 3u << 20);
  EXPECT_EQ(MustParseSize("4G"), 4ull << 30);
  EXPECT_EQ(MustParseSize("4 GiB"), 4ull << 30);
  EXPECT_EQ(MustParseSize("2T"), 2ull << 40);
  EXPECT_EQ(MustParseSize("2TiB"), 2ull << 40);
}

TEST(ParseSizeTest, Overflow) {
  EXPECT_NE(SizeError("16777216TiB").find("too large"), std::string::npos);  // 2^24 * 2^40
  EXPECT_EQ(MustParseSize("16777215TiB"), 16777215ull << 40);
  SizeError("99999999999999999999");  // does not fit 64 bits at all
  EXPECT_EQ(MustParseSize("18446744073709551615"), UINT64_MAX);
}

TEST(ParseSizeTest, BadInput) {
  EXPECT_NE(SizeError("32KB").find("unknown unit"), std::string::npos);
  SizeError("32kib");
  SizeError("KiB");
  SizeError("");
  SizeError("-1");
  SizeError("1.5GiB");
  SizeError(" 32");
  SizeError("12XB");
  SizeError("lots");
}

TEST(FormatSizeTest, Formats) {
  EXPECT_EQ(FormatSize(0), "0 B");
  EXPECT_EQ(FormatSize(100), "100 B");
  EXPECT_EQ(FormatSize(1023), "1023 B");
  EXPECT_EQ(FormatSize(1024), "1 KiB");
  EXPECT_EQ(FormatSize(32 * 1024), "32 KiB");
  EXPECT_EQ(FormatSize(1536), "1.5 KiB");
  EXPECT_EQ(FormatSize(3ull << 29), "1.5 GiB");
  EXPECT_EQ(FormatSize(4ull << 30), "4 GiB");
  EXPECT_EQ(FormatSize(1ull << 40), "1 TiB");
  EXPECT_EQ(FormatSize(2ull << 50), "2 PiB");
}

TEST(FormatSizeTest, RoundTripsThroughParse) {
  for (uint64_t v : {1ull << 10, 7ull << 20, 4ull << 30, 3ull << 40}) {
    std::string text = FormatSize(v);
    EXPECT_EQ(MustParseSize(text), v) << text;
  }
}

// ---------------------------------------------------------------------------
// ParseUnsigned / ParseDecimal

TEST(ParseUnsignedTest, AcceptsPlainDecimalDigits) {
  EXPECT_EQ(ParseUnsigned("0").value(), 0u);
  EXPECT_EQ(ParseUnsigned("42").value(), 42u);
  EXPECT_EQ(ParseUnsigned("007").value(), 7u);  // decimal, not octal
  EXPECT_EQ(ParseUnsigned("18446744073709551615").value(), UINT64_MAX);
  EXPECT_EQ(ParseUnsigned("4294967295", UINT32_MAX).value(), UINT32_MAX);
}

TEST(ParseUnsignedTest, RejectsEverythingElse) {
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "0x10", "1.5", "many", "1e3"}) {
    const Result<uint64_t> r = ParseUnsigned(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), "'" + std::string(bad) + "' is not a non-negative integer");
  }
}

TEST(ParseUnsignedTest, TooLarge) {
  EXPECT_EQ(ParseUnsigned("4294967296", UINT32_MAX).status().message(),
            "'4294967296' is too large (at most 4294967295)");
  EXPECT_NE(ParseUnsigned("18446744073709551616").status().message().find("too large"),
            std::string::npos);
  EXPECT_FALSE(ParseUnsigned("11", 10).ok());
  EXPECT_TRUE(ParseUnsigned("10", 10).ok());
}

TEST(ParseDecimalTest, FiniteNumbers) {
  EXPECT_DOUBLE_EQ(ParseDecimal("0.01").value(), 0.01);
  EXPECT_DOUBLE_EQ(ParseDecimal("1e-3").value(), 1e-3);
  EXPECT_DOUBLE_EQ(ParseDecimal("-2").value(), -2.0);
  EXPECT_DOUBLE_EQ(ParseDecimal("3").value(), 3.0);
  for (const char* bad : {"", "fast", "1.5x", " 1", "inf", "nan", "1e999"}) {
    const Result<double> r = ParseDecimal(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().message(), "'" + std::string(bad) + "' is not a number");
  }
}

// ---------------------------------------------------------------------------
// SafeForLog

TEST(SafeForLogTest, PrintableTextIsUnchanged) {
  EXPECT_EQ(SafeForLog("job-1/fc1.weight:0"), "job-1/fc1.weight:0");
  EXPECT_EQ(SafeForLog("it's a \\path\\"), "it's a \\path\\");
  EXPECT_EQ(SafeForLog("gr\xc3\xbc\xc3\x9f" "e \xe6\x97\xa5\xf0\x9f\x98\x80"),
            "gr\xc3\xbc\xc3\x9f" "e \xe6\x97\xa5\xf0\x9f\x98\x80")
      << "valid printable UTF-8 passes";
  EXPECT_EQ(SafeForLog(""), "");
  EXPECT_EQ(QuoteForLog("a b"), "'a b'");
}

TEST(SafeForLogTest, EscapesWhatBreaksOrDisguisesALine) {
  EXPECT_EQ(SafeForLog("a\nb"), "a\\x0ab");
  EXPECT_EQ(SafeForLog(std::string("\r\t\x1b[31m\x7f\0", 9)), "\\x0d\\x09\\x1b[31m\\x7f\\x00");
  // Invalid UTF-8: a lone continuation byte, a truncated sequence, an overlong
  // '/', a surrogate, beyond U+10FFFF.
  EXPECT_EQ(SafeForLog("\x80"), "\\x80");
  EXPECT_EQ(SafeForLog("\xe6\x97"), "\\xe6\\x97");
  EXPECT_EQ(SafeForLog("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(SafeForLog("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(SafeForLog("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");
  // Valid but disguising: NEL (U+0085), LINE SEPARATOR, RIGHT-TO-LEFT OVERRIDE, BOM.
  EXPECT_EQ(SafeForLog("\xc2\x85"), "\\xc2\\x85");
  EXPECT_EQ(SafeForLog("\xe2\x80\xa8"), "\\xe2\\x80\\xa8");
  EXPECT_EQ(SafeForLog("\xe2\x80\xae"), "\\xe2\\x80\\xae");
  EXPECT_EQ(SafeForLog("\xef\xbb\xbf"), "\\xef\\xbb\\xbf");
}

TEST(SafeForLogTest, ForgedLogLineStaysOnOneLine) {
  const std::string forged = "a\n2024-01-01T00:00:00.000 info admin: DeleteTenant 'prod'";
  const std::string safe = SafeForLog(forged);
  EXPECT_EQ(safe.find('\n'), std::string::npos);
  EXPECT_EQ(safe, "a\\x0a2024-01-01T00:00:00.000 info admin: DeleteTenant 'prod'");
}

TEST(SafeForLogTest, TruncatesWithTheOriginalLength) {
  const std::string big(1 << 20, 'n');
  const std::string safe = SafeForLog(big);
  EXPECT_EQ(safe, std::string(128, 'n') + "...(1048576 bytes)");
  EXPECT_EQ(SafeForLog("abcdef", 3), "abc...(6 bytes)");
  EXPECT_EQ(SafeForLog("abc", 3), "abc");
  // Worst case: every byte escaped.
  const std::string controls(1 << 20, '\n');
  EXPECT_LE(SafeForLog(controls).size(), 4u * 128 + 24);
  // A character cut by the limit is escaped, never split raw.
  EXPECT_EQ(SafeForLog("ab\xe6\x97\xa5", 3), "ab\\xe6...(5 bytes)");
}

TEST(SafeForLogTest, IdempotentOnItsOwnOutput) {
  for (std::string s : {std::string("a\nb\x80" "c"), std::string("\xe2\x80\xae'x'\\y"),
                        std::string("plain")}) {
    const std::string once = SafeForLog(s);
    EXPECT_EQ(SafeForLog(once), once) << once;
  }
}

}  // namespace
}  // namespace rackhub
