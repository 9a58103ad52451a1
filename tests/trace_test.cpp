// Workload inputs of the simulator (sim/): trace readers against the real shared traces and
// hand-made malformed files, workload shaping, synthetic arrivals, prompt tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "sim/random.hpp"
#include "sim/trace.hpp"
#include "sim/workload.hpp"
#include "tests/support/golden.hpp"

namespace troupe::sim {
// Readable failure output for EXPECT_EQ on requests.
void PrintTo(const trace_request& r, std::ostream* os) {
  *os << "{arrival_ns " << r.arrival_ns << ", in " << r.input_tokens << ", out " << r.output_tokens
      << ", " << r.hash_ids.size() << " hash ids}";
}
}  // namespace troupe::sim

namespace {

using troupe::errc;
using troupe::sim::trace_format;
using troupe::sim::trace_request;

// The full traces (shared data: skipped without it) and their first 300 rows (bundled).
const char* const azure_code = "traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv";
const char* const azure_conv = "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv";
const char* const mooncake = "traces/mooncake/conversation_trace.jsonl";
std::string azure_code_head() { return troupe::testing::test_data("traces/azure_llm_2023/AzureLLMInferenceTrace_code_head300.csv"); }
std::string azure_conv_head() { return troupe::testing::test_data("traces/azure_llm_2023/AzureLLMInferenceTrace_conv_head300.csv"); }
std::string mooncake_head() { return troupe::testing::test_data("traces/mooncake/conversation_trace_head300.jsonl"); }

std::vector<trace_request> read_ok(const std::string& path, trace_format format) {
  auto requests = troupe::sim::read_trace(path, format);
  EXPECT_TRUE(requests.has_value()) << (requests ? "" : requests.error().message);
  return requests ? *requests : std::vector<trace_request>{};
}

trace_request req(int64_t arrival_ns, int32_t in, int32_t out, std::vector<uint64_t> hash_ids = {}) {
  trace_request r;
  r.arrival_ns = arrival_ns;
  r.input_tokens = in;
  r.output_tokens = out;
  r.hash_ids = std::move(hash_ids);
  return r;
}

void expect_sorted_and_valid(const std::vector<trace_request>& requests) {
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests.front().arrival_ns, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_GE(requests[i].input_tokens, 1);
    EXPECT_GE(requests[i].output_tokens, 1);
    if (i > 0) {
      EXPECT_LE(requests[i - 1].arrival_ns, requests[i].arrival_ns) << i;
    }
  }
}

/// Writes `content` to a fresh temp file and returns its path.
std::string temp_file(const std::string& name, const std::string& content) {
  const std::string path = ::testing::TempDir() + "troupe_trace_test_" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

/// Reads `content` as a trace file and requires a malformed_file error "PATH:LINE: ...what...".
void expect_malformed(const std::string& name, trace_format format, const std::string& content,
                      int line, const std::string& what) {
  const std::string path = temp_file(name, content);
  auto requests = troupe::sim::read_trace(path, format);
  ASSERT_FALSE(requests.has_value()) << name << " parsed";
  EXPECT_EQ(requests.error().code, errc::malformed_file) << requests.error().message;
  const std::string prefix = line > 0 ? path + ":" + std::to_string(line) + ": " : path + ": ";
  EXPECT_EQ(requests.error().message.rfind(prefix, 0), 0u) << requests.error().message;
  EXPECT_NE(requests.error().message.find(what), std::string::npos) << requests.error().message;
  std::remove(path.c_str());
}

const std::string azure_header = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n";

}  // namespace

// ---------------------------------------------------------------------------------------------
// The real traces

TEST(AzureTrace, CodeHeadRowsFirstAndLast) {
  const auto r = read_ok(azure_code_head(), trace_format::azure);
  ASSERT_EQ(r.size(), 300u);
  expect_sorted_and_valid(r);
  EXPECT_EQ(r[0], req(0, 4808, 10));
  EXPECT_EQ(r[1], req(52'000'000, 3180, 8));
  // 2023-11-16 18:20:40.8181990,176,88 (a line end after the last row)
  EXPECT_EQ(r.back(), req(216'838'239'000, 176, 88));
}

TEST(AzureTrace, ConvHeadRowsFirstAndLast) {
  const auto r = read_ok(azure_conv_head(), trace_format::azure);
  ASSERT_EQ(r.size(), 300u);
  expect_sorted_and_valid(r);
  EXPECT_EQ(r[0], req(0, 374, 44));
  EXPECT_EQ(r[1], req(4'314'579'000, 396, 109));
  // 2023-11-16 18:17:10.7096920,212,183
  EXPECT_EQ(r.back(), req(84'029'102'000, 212, 183));
}

TEST(MooncakeTrace, HeadRowsFirstAndLastAndHashIds) {
  const auto r = read_ok(mooncake_head(), trace_format::mooncake);
  ASSERT_EQ(r.size(), 300u);
  expect_sorted_and_valid(r);
  EXPECT_EQ(r[0], req(0, 6758, 500, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}));
  EXPECT_EQ(r[1].hash_ids.front(), 0u);
  EXPECT_EQ(r[1].hash_ids[1], 14u);
  // {"timestamp": 102000, "input_length": 979, "output_length": 140, "hash_ids": [0, 7813]}
  EXPECT_EQ(r.back(), req(102'000'000'000, 979, 140, {0, 7813}));
}

TEST(AzureTrace, CodeRowsFirstAndLast) {
  TROUPE_SHARED_DATA_OR_SKIP(path, azure_code);
  const auto r = read_ok(path, trace_format::azure);
  ASSERT_EQ(r.size(), 8819u);
  expect_sorted_and_valid(r);
  // 2023-11-16 18:17:03.9799600,4808,10
  EXPECT_EQ(r[0], req(0, 4808, 10));
  // 2023-11-16 18:17:04.0319600,3180,8
  EXPECT_EQ(r[1], req(52'000'000, 3180, 8));
  // 2023-11-16 19:14:19.9280160,549,173 (no line end after the last row)
  EXPECT_EQ(r.back(), req(3'435'948'056'000, 549, 173));
}

TEST(AzureTrace, ConvRowsFirstAndLast) {
  TROUPE_SHARED_DATA_OR_SKIP(path, azure_conv);
  const auto r = read_ok(path, trace_format::azure);
  ASSERT_EQ(r.size(), 19366u);
  expect_sorted_and_valid(r);
  // 2023-11-16 18:15:46.6805900,374,44
  EXPECT_EQ(r[0], req(0, 374, 44));
  // 2023-11-16 18:15:50.9951690,396,109
  EXPECT_EQ(r[1], req(4'314'579'000, 396, 109));
  // 2023-11-16 19:14:08.4025270,197,183
  EXPECT_EQ(r.back(), req(3'501'721'937'000, 197, 183));
}

TEST(MooncakeTrace, RowsFirstAndLastAndHashIds) {
  TROUPE_SHARED_DATA_OR_SKIP(path, mooncake);
  const auto r = read_ok(path, trace_format::mooncake);
  ASSERT_EQ(r.size(), 12031u);
  expect_sorted_and_valid(r);
  EXPECT_EQ(r[0], req(0, 6758, 500, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}));
  EXPECT_EQ(r[1].hash_ids.front(), 0u);  // shares its first block with row 0
  EXPECT_EQ(r[1].hash_ids[1], 14u);
  EXPECT_EQ(r[10].arrival_ns, 3'000'000'000);  // first row after t = 0: timestamp 3000 ms
  // {"timestamp": 3536999, "input_length": 20774, "output_length": 508, "hash_ids": [0, 182750, ..., 182789]}
  const trace_request& last = r.back();
  EXPECT_EQ(last.arrival_ns, 3'536'999'000'000);
  EXPECT_EQ(last.input_tokens, 20774);
  EXPECT_EQ(last.output_tokens, 508);
  ASSERT_EQ(last.hash_ids.size(), 41u);
  EXPECT_EQ(last.hash_ids[0], 0u);
  EXPECT_EQ(last.hash_ids[1], 182750u);
  EXPECT_EQ(last.hash_ids[40], 182789u);
  for (const auto& q : r)  // one id per started 512-token block, in this trace
    EXPECT_EQ(q.hash_ids.size(), static_cast<size_t>((q.input_tokens + 511) / 512));
}

// ---------------------------------------------------------------------------------------------
// Parsing details

TEST(TraceFormat, Names) {
  EXPECT_EQ(troupe::sim::parse_trace_format("azure").value(), trace_format::azure);
  EXPECT_EQ(troupe::sim::parse_trace_format("mooncake").value(), trace_format::mooncake);
  auto bad = troupe::sim::parse_trace_format("csv");
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, errc::invalid_argument);
  EXPECT_NE(bad.error().message.find("'csv'"), std::string::npos) << bad.error().message;
}

TEST(TraceFormat, DaysFromCivil) {
  EXPECT_EQ(troupe::sim::days_from_civil(1970, 1, 1), 0);
  EXPECT_EQ(troupe::sim::days_from_civil(1969, 12, 31), -1);
  EXPECT_EQ(troupe::sim::days_from_civil(2000, 3, 1), 11017);
  EXPECT_EQ(troupe::sim::days_from_civil(2023, 11, 16), 19677);
  EXPECT_EQ(troupe::sim::days_from_civil(2024, 2, 29), 19782);
  EXPECT_EQ(troupe::sim::days_from_civil(1900, 3, 1), -25508);
  EXPECT_EQ(troupe::sim::days_from_civil(2200, 12, 31), 84370);
}

TEST(AzureParse, LineEndsColumnOrderFractionsAndDayBoundaries) {
  // LF and CR LF, blank lines, reordered and extra columns, 1..9 fractional digits, midnight
  // and a leap day crossed.
  const std::string text =
      "GeneratedTokens, ContextTokens ,Extra,TIMESTAMP\n"
      "7,100,x,2024-02-28 23:59:59.5\r\n"
      "\n"
      "8,200,y,2024-02-29 00:00:00\n"
      "9,300,z,2024-03-01 00:00:00.000000001";
  auto r = troupe::sim::parse_trace(text, trace_format::azure, "mem.csv");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0], req(0, 100, 7));
  EXPECT_EQ((*r)[1], req(500'000'000, 200, 8));
  EXPECT_EQ((*r)[2], req(500'000'000 + 86'400'000'000'001, 300, 9));
}

TEST(AzureParse, EachErrorNamesFileAndLine) {
  const std::string row = "2023-11-16 18:15:46.6805900,374,44\r\n";
  expect_malformed("missing_column.csv", trace_format::azure,
                   "TIMESTAMP,ContextTokens\r\n2023-11-16 18:15:46.6805900,374\r\n", 1,
                   "header has no column GeneratedTokens");
  expect_malformed("non_numeric.csv", trace_format::azure,
                   azure_header + row + "2023-11-16 18:15:47.0000000,abc,44\r\n", 3,
                   "column 2 (ContextTokens) is not an integer: 'abc'");
  expect_malformed("empty_field.csv", trace_format::azure,
                   azure_header + row + "2023-11-16 18:15:47.0000000,12,\r\n", 3,
                   "column 3 (GeneratedTokens) is empty");
  expect_malformed("zero_input.csv", trace_format::azure,
                   azure_header + "2023-11-16 18:15:46.6805900,0,44\r\n", 2,
                   "column 2 (ContextTokens) must be >= 1, got 0");
  expect_malformed("negative_output.csv", trace_format::azure,
                   azure_header + row + row + "2023-11-16 18:15:47.0000000,5,-3\r\n", 4,
                   "column 3 (GeneratedTokens) must be >= 1, got -3");
  expect_malformed("huge_output.csv", trace_format::azure,
                   azure_header + "2023-11-16 18:15:47.0000000,5,2147483648\r\n", 2,
                   "column 3 (GeneratedTokens) 2147483648 exceeds 2147483647");
  expect_malformed("backwards.csv", trace_format::azure,
                   azure_header + row + "2023-11-16 18:15:46.6805899,10,10\r\n", 3,
                   "column 1 (TIMESTAMP) '2023-11-16 18:15:46.6805899' is earlier than the previous row's");
  expect_malformed("truncated.csv", trace_format::azure,
                   azure_header + row + "2023-11-16 18:15:47.00", 3,
                   "expected 3 comma-separated fields, got 1 (truncated line?)");
  expect_malformed("bad_timestamp.csv", trace_format::azure,
                   azure_header + "2023/11/16 18:15:46,1,1\r\n", 2,
                   "column 1 (TIMESTAMP) is not YYYY-MM-DD HH:MM:SS[.fraction]");
  expect_malformed("bad_date.csv", trace_format::azure,
                   azure_header + "2023-02-29 18:15:46.1,1,1\r\n", 2,
                   "column 1 (TIMESTAMP) is not a valid date and time");
  expect_malformed("ten_fraction_digits.csv", trace_format::azure,
                   azure_header + "2023-11-16 18:15:46.1234567890,1,1\r\n", 2,
                   "column 1 (TIMESTAMP) is not YYYY-MM-DD");
  expect_malformed("header_only.csv", trace_format::azure, azure_header, 0,
                   "no requests after the header");
  expect_malformed("empty.csv", trace_format::azure, "", 0, "empty");
}

TEST(MooncakeParse, KeyOrderWhitespaceAndUnknownKeys) {
  const std::string text =
      "{ \"hash_ids\" :[ 7 ,8 ], \"output_length\":2,\"timestamp\":1000 ,\"input_length\":  600,"
      " \"extra\": {\"a\": [1, \"x\\\"}\", true, null, -2.5e3]}}\r\n"
      "\n"
      "{\"timestamp\": 1002, \"input_length\": 1, \"output_length\": 3, \"hash_ids\": []}\n";
  auto r = troupe::sim::parse_trace(text, trace_format::mooncake, "mem.jsonl");
  ASSERT_TRUE(r.has_value()) << r.error().message;
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0], req(0, 600, 2, {7, 8}));
  EXPECT_EQ((*r)[1], req(2'000'000, 1, 3));
}

TEST(MooncakeParse, EachErrorNamesFileAndLine) {
  const std::string row = "{\"timestamp\": 10, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1]}\n";
  expect_malformed("bad_json.jsonl", trace_format::mooncake,
                   row + "{\"timestamp\" 11, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": []}\n", 2,
                   "bad JSON: expected ':', found '11,");
  expect_malformed("truncated.jsonl", trace_format::mooncake, row + "{\"timestamp\": 11, \"input_length\": 6", 2,
                   "bad JSON: expected '}', found end of line");
  expect_malformed("non_numeric.jsonl", trace_format::mooncake,
                   row + row + "{\"timestamp\": 11, \"input_length\": \"600\", \"output_length\": 5, \"hash_ids\": []}\n",
                   3, "bad JSON: input_length: expected an integer");
  expect_malformed("fraction.jsonl", trace_format::mooncake,
                   "{\"timestamp\": 10.5, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": []}\n", 1,
                   "bad JSON: timestamp: expected an integer, not a fraction");
  expect_malformed("negative_hash.jsonl", trace_format::mooncake,
                   "{\"timestamp\": 10, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, -1]}\n", 1,
                   "bad JSON: hash_ids: expected a non-negative integer");
  expect_malformed("zero_output.jsonl", trace_format::mooncake,
                   row + "{\"timestamp\": 11, \"input_length\": 600, \"output_length\": 0, \"hash_ids\": []}\n", 2,
                   "output_length must be >= 1, got 0");
  expect_malformed("negative_input.jsonl", trace_format::mooncake,
                   "{\"timestamp\": 11, \"input_length\": -4, \"output_length\": 1, \"hash_ids\": []}\n", 1,
                   "input_length must be >= 1, got -4");
  expect_malformed("missing_key.jsonl", trace_format::mooncake,
                   row + "{\"timestamp\": 11, \"input_length\": 600, \"output_length\": 5}\n", 2,
                   "missing key \"hash_ids\"");
  expect_malformed("duplicate_key.jsonl", trace_format::mooncake,
                   "{\"timestamp\": 1, \"timestamp\": 2, \"input_length\": 6, \"output_length\": 5, \"hash_ids\": []}\n",
                   1, "duplicate key \"timestamp\"");
  expect_malformed("backwards.jsonl", trace_format::mooncake,
                   row + "{\"timestamp\": 9, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": []}\n", 2,
                   "timestamp 9 is earlier than the previous line's 10");
  expect_malformed("trailing.jsonl", trace_format::mooncake, row + row + row + "{}}\n", 4,
                   "unexpected text after the object");
  expect_malformed("not_an_object.jsonl", trace_format::mooncake, "[1, 2]\n", 1, "bad JSON: expected '{'");
  expect_malformed("empty.jsonl", trace_format::mooncake, "\r\n\n", 0, "no requests");
}

TEST(TraceRead, MissingFileIsAnIoErrorNamingThePath) {
  const std::string path = ::testing::TempDir() + "troupe_trace_test_does_not_exist.csv";
  auto r = troupe::sim::read_trace(path, trace_format::azure);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, errc::io_error);
  EXPECT_NE(r.error().message.find(path), std::string::npos) << r.error().message;
}

// ---------------------------------------------------------------------------------------------
// Workload shaping

TEST(ShapeWorkload, DefaultsChangeNothing) {
  const std::vector<trace_request> in = {req(0, 1000, 100, {1, 2}), req(7, 3, 1), req(7, 5, 9)};
  EXPECT_EQ(troupe::sim::shape_workload(in, {}), in);
}

TEST(ShapeWorkload, ScaleClipCompressTruncateExactly) {
  const std::vector<trace_request> in = {
      req(0, 1000, 100, {1, 2}),    // -> 500, 50; one block left
      req(1000, 3, 1),              // 1.5 -> 2 and 0.5 -> 1 (round half up, min 1)
      req(1002, 5, 4000, {1, 5}),   // 2.5 -> 3, 2000 -> clipped to 1 + 1023
      req(1003, 2000, 100, {4, 5, 6, 7}),  // 1000 + 50 > 1024: input shrinks to 974
      req(5000, 10, 10),            // dropped by max_requests
  };
  troupe::sim::workload_options o;
  o.length_scale = 0.5;
  o.time_scale = 4.0;
  o.max_context = 1024;
  o.max_requests = 4;
  ASSERT_TRUE(troupe::sim::validate(o).has_value());
  const std::vector<trace_request> expected = {
      req(0, 500, 50, {1}),
      req(250, 2, 1),            // 1000 / 4
      req(251, 1, 1023, {1}),    // 1002 / 4 = 250.5 -> 251
      req(251, 974, 50, {4, 5}), // 1003 / 4 = 250.75 -> 251
  };
  EXPECT_EQ(troupe::sim::shape_workload(in, o), expected);
}

TEST(ShapeWorkload, ScalingUpKeepsHashIdsAndStretchesTime) {
  troupe::sim::workload_options o;
  o.length_scale = 2.0;
  o.time_scale = 0.5;  // twice as slow
  const std::vector<trace_request> in = {req(0, 600, 3, {9, 8}), req(3, 1, 1)};
  const std::vector<trace_request> expected = {req(0, 1200, 6, {9, 8}), req(6, 2, 2)};
  EXPECT_EQ(troupe::sim::shape_workload(in, o), expected);
}

TEST(ShapeWorkload, RealTraceCompressed16x) {
  TROUPE_SHARED_DATA_OR_SKIP(path, azure_conv);
  const auto r = read_ok(path, trace_format::azure);
  troupe::sim::workload_options o;
  o.time_scale = 16.0;
  o.max_context = 4096;
  const auto shaped = troupe::sim::shape_workload(r, o);
  ASSERT_EQ(shaped.size(), r.size());
  EXPECT_EQ(shaped.back().arrival_ns, 218'857'621'063);  // 3,501,721,937,000 / 16 = ...062.5 -> 063
  for (const auto& q : shaped) EXPECT_LE(q.input_tokens + q.output_tokens, 4096);
  expect_sorted_and_valid(shaped);
}

TEST(ShapeWorkload, ValidateNamesTheField) {
  troupe::sim::workload_options o;
  o.length_scale = 0.0;
  EXPECT_NE(troupe::sim::validate(o).error().message.find("length_scale"), std::string::npos);
  o = {};
  o.time_scale = std::nan("");
  EXPECT_NE(troupe::sim::validate(o).error().message.find("time_scale"), std::string::npos);
  o = {};
  o.max_context = 1;
  EXPECT_NE(troupe::sim::validate(o).error().message.find("max_context"), std::string::npos);
  o = {};
  o.max_requests = -1;
  EXPECT_EQ(troupe::sim::validate(o).error().code, errc::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// Randomness and synthetic arrivals

TEST(RandomSource, EngineIsTheStandardMt19937_64) {
  // The standard fixes mt19937_64's 10000th output for the default seed 5489.
  troupe::sim::random_source rng(5489);
  for (int i = 0; i < 9999; ++i) (void)rng.next_u64();
  EXPECT_EQ(rng.next_u64(), 9981545732273789042ULL);
}

TEST(RandomSource, DistributionsHaveTheirMoments) {
  troupe::sim::random_source rng(7);
  const int n = 200'000;
  const auto moments = [&](auto draw, double& mean, double& var) {
    double sum = 0, sum2 = 0;
    for (int i = 0; i < n; ++i) {
      const double x = draw();
      sum += x;
      sum2 += x * x;
    }
    mean = sum / n;
    var = sum2 / n - mean * mean;
  };
  double mean = 0, var = 0;
  moments([&] { return rng.standard_normal(); }, mean, var);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.02);
  moments([&] { return rng.gamma(2.5); }, mean, var);  // mean = var = shape
  EXPECT_NEAR(mean, 2.5, 0.02);
  EXPECT_NEAR(var, 2.5, 0.06);
  moments([&] { return rng.gamma(0.25); }, mean, var);
  EXPECT_NEAR(mean, 0.25, 0.005);
  EXPECT_NEAR(var, 0.25, 0.02);
  for (int i = 0; i < 1000; ++i) {
    const int64_t v = rng.uniform_between(-2, 2);
    EXPECT_TRUE(v >= -2 && v <= 2);
  }
}

namespace {

troupe::sim::synthetic_options synthetic(uint64_t seed, double cv) {
  troupe::sim::synthetic_options o;
  o.num_requests = 10'000;
  o.rate_per_s = 50.0;
  o.cv = cv;
  o.input_mean = 512;
  o.output_mean = 101;
  o.seed = seed;
  return o;
}

/// Squared coefficient of variation of the inter-arrival gaps.
double gap_cv2(const std::vector<trace_request>& r) {
  double sum = 0, sum2 = 0;
  for (size_t i = 1; i < r.size(); ++i) {
    const double gap = static_cast<double>(r[i].arrival_ns - r[i - 1].arrival_ns);
    sum += gap;
    sum2 += gap * gap;
  }
  const double n = static_cast<double>(r.size() - 1);
  const double mean = sum / n;
  return (sum2 / n - mean * mean) / (mean * mean);
}

double mean_rate_per_s(const std::vector<trace_request>& r) {
  return static_cast<double>(r.size() - 1) / (static_cast<double>(r.back().arrival_ns) * 1e-9);
}

}  // namespace

TEST(SyntheticWorkload, SameSeedSameWorkloadOtherSeedOther) {
  const auto a = troupe::sim::synthetic_workload(synthetic(42, 1.0));
  EXPECT_EQ(a, troupe::sim::synthetic_workload(synthetic(42, 1.0)));
  const auto b = troupe::sim::synthetic_workload(synthetic(43, 1.0));
  ASSERT_EQ(a.size(), b.size());
  int num_same_arrivals = 0;
  for (size_t i = 1; i < a.size(); ++i) num_same_arrivals += a[i].arrival_ns == b[i].arrival_ns;
  EXPECT_EQ(num_same_arrivals, 0);
  EXPECT_NE(a, b);
}

TEST(SyntheticWorkload, PinnedDraws) {
  // The "unseed" check: the draws of seed 42, reproduced independently by a Python
  // re-implementation of mt19937_64, derive_seed and the distributions in sim/random.hpp. Any
  // change to the generator or its distributions (or a libm that rounds differently) shows here.
  const auto a = troupe::sim::synthetic_workload(synthetic(42, 1.0));
  EXPECT_EQ(a[0], req(0, 502, 144));
  EXPECT_EQ(a[1], req(3464363, 469, 116));
  EXPECT_EQ(a[2].arrival_ns, 43790612);
  EXPECT_EQ(troupe::sim::synthetic_workload(synthetic(42, 4.0))[1].arrival_ns, 40683);
}

TEST(SyntheticWorkload, RateLengthsAndBurstiness) {
  const auto poisson = troupe::sim::synthetic_workload(synthetic(1, 1.0));
  const auto bursty = troupe::sim::synthetic_workload(synthetic(1, 4.0));
  ASSERT_EQ(poisson.size(), 10'000u);
  expect_sorted_and_valid(poisson);
  expect_sorted_and_valid(bursty);
  // Mean of 9,999 gaps: relative standard error cv / sqrt(9999) = 1% (cv 1), 4% (cv 4); the
  // bounds are four of those.
  EXPECT_NEAR(mean_rate_per_s(poisson), 50.0, 50.0 * 0.04);
  EXPECT_NEAR(mean_rate_per_s(bursty), 50.0, 50.0 * 0.16);
  // Exponential gaps have cv^2 = 1; Gamma(1/16) gaps have cv^2 = 16.
  EXPECT_NEAR(gap_cv2(poisson), 1.0, 0.1);
  EXPECT_GT(gap_cv2(bursty), 10.0);
  EXPECT_LT(gap_cv2(bursty), 22.0);
  // Lengths come from their own stream: the same for every cv; uniform in [mean/2, 3 mean/2].
  double sum_in = 0;
  for (size_t i = 0; i < poisson.size(); ++i) {
    EXPECT_EQ(poisson[i].input_tokens, bursty[i].input_tokens);
    EXPECT_EQ(poisson[i].output_tokens, bursty[i].output_tokens);
    EXPECT_TRUE(poisson[i].input_tokens >= 256 && poisson[i].input_tokens <= 768);
    EXPECT_TRUE(poisson[i].output_tokens >= 51 && poisson[i].output_tokens <= 151);
    sum_in += poisson[i].input_tokens;
  }
  EXPECT_NEAR(sum_in / 10'000.0, 512.0, 6.0);  // sd of the mean: 148 / 100
}

TEST(SyntheticWorkload, ValidateNamesTheField) {
  auto o = synthetic(0, 0.0);
  EXPECT_NE(troupe::sim::validate(o).error().message.find("cv"), std::string::npos);
  o = synthetic(0, 1.0);
  o.rate_per_s = 0.0;
  EXPECT_NE(troupe::sim::validate(o).error().message.find("rate_per_s"), std::string::npos);
  o = synthetic(0, 1.0);
  o.input_mean = 0;
  EXPECT_NE(troupe::sim::validate(o).error().message.find("input_mean"), std::string::npos);
  o = synthetic(0, 1.0);
  o.num_requests = 0;
  EXPECT_TRUE(troupe::sim::validate(o).has_value());
  EXPECT_TRUE(troupe::sim::synthetic_workload(o).empty());
}

// ---------------------------------------------------------------------------------------------
// Prompt tokens

namespace {

bool same_tokens(const std::vector<int32_t>& a, const std::vector<int32_t>& b, size_t from, size_t to) {
  return std::equal(a.begin() + from, a.begin() + to, b.begin() + from);
}

/// Positions in [from, to) where a and b differ.
int num_differing(const std::vector<int32_t>& a, const std::vector<int32_t>& b, size_t from, size_t to) {
  int n = 0;
  for (size_t i = from; i < to; ++i) n += a[i] != b[i];
  return n;
}

}  // namespace

TEST(PromptTokens, LengthBosRangeAndPins) {
  const trace_request r = req(0, 1000, 1);
  const auto t = troupe::sim::prompt_tokens(r, 5, 512, 512, 99);
  ASSERT_EQ(t.size(), 1000u);
  EXPECT_EQ(t[0], 1);
  std::set<int32_t> distinct;
  for (size_t i = 1; i < t.size(); ++i) {
    EXPECT_GE(t[i], 3);
    EXPECT_LT(t[i], 512);
    distinct.insert(t[i]);
  }
  EXPECT_GT(distinct.size(), 400u);  // 999 draws over 509 ids cover most of them
  EXPECT_EQ(troupe::sim::prompt_tokens(req(0, 1, 1), 0, 512, 512, 0), std::vector<int32_t>{1});
  // Pinned (reproduced by ten lines of Python: SplitMix64's finalizer and a multiply-shift):
  // fixed integer arithmetic, so these ids are the same on every machine.
  EXPECT_EQ(std::vector<int32_t>(t.begin(), t.begin() + 4), (std::vector<int32_t>{1, 119, 289, 20}));
  const auto m = troupe::sim::prompt_tokens(req(0, 3, 1, {0}), 0, 32000, 512, 0);
  EXPECT_EQ(m, (std::vector<int32_t>{1, 22485, 6084}));
}

TEST(PromptTokens, PerRequestTokensFollowSeedAndIndex) {
  const trace_request r = req(0, 300, 1);
  const auto t = troupe::sim::prompt_tokens(r, 5, 512, 512, 99);
  EXPECT_EQ(t, troupe::sim::prompt_tokens(r, 5, 512, 512, 99));
  EXPECT_GT(num_differing(t, troupe::sim::prompt_tokens(r, 6, 512, 512, 99), 1, 300), 280);
  EXPECT_GT(num_differing(t, troupe::sim::prompt_tokens(r, 5, 512, 512, 100), 1, 300), 280);
}

TEST(PromptTokens, SharedHashIdsShareBlocks) {
  // Two requests (different indices) agree on hash ids 10, 11 and then diverge.
  const auto a = troupe::sim::prompt_tokens(req(0, 1200, 1, {10, 11, 12}), 0, 512, 512, 7);
  const auto b = troupe::sim::prompt_tokens(req(0, 1300, 1, {10, 11, 99}), 1, 512, 512, 7);
  EXPECT_TRUE(same_tokens(a, b, 0, 1024));
  EXPECT_GT(num_differing(a, b, 1024, 1200), 170);
  // A different first id changes the first block; a block's tokens depend on its id alone.
  const auto c = troupe::sim::prompt_tokens(req(0, 1024, 1, {20, 11}), 2, 512, 512, 7);
  EXPECT_GT(num_differing(a, c, 1, 512), 500);
  EXPECT_TRUE(same_tokens(a, c, 512, 1024));
  // Block tokens do not depend on the seed; tokens past the hash-id blocks do.
  const auto d = troupe::sim::prompt_tokens(req(0, 700, 1, {10}), 0, 512, 512, 8);
  const auto e = troupe::sim::prompt_tokens(req(0, 700, 1, {10}), 0, 512, 512, 9);
  EXPECT_TRUE(same_tokens(a, d, 0, 512));
  EXPECT_TRUE(same_tokens(d, e, 0, 512));
  EXPECT_GT(num_differing(d, e, 512, 700), 180);
}

TEST(PromptTokens, RealMooncakePrefixReuse) {
  const auto r = read_ok(mooncake_head(), trace_format::mooncake);
  ASSERT_GE(r.size(), 2u);
  // Rows 0 and 1 share hash id 0 (block 0) and nothing else.
  const auto a = troupe::sim::prompt_tokens(r[0], 0, 32000, troupe::sim::mooncake_block_tokens, 1);
  const auto b = troupe::sim::prompt_tokens(r[1], 1, 32000, troupe::sim::mooncake_block_tokens, 1);
  ASSERT_EQ(a.size(), 6758u);
  ASSERT_EQ(b.size(), 7322u);
  EXPECT_TRUE(same_tokens(a, b, 0, 512));
  EXPECT_GT(num_differing(a, b, 512, 1024), 500);
}
