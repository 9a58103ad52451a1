// The trace formats besides Azure and Mooncake (sim/trace.hpp): BurstGPT, Vidur request
// traces and length-only datasets through the one header-driven CSV reader; format detection;
// arrivals drawn for length-only data; `troupe trace stats` (sim/trace_stats.hpp).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sim/trace.hpp"
#include "sim/trace_stats.hpp"
#include "sim/workload.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/process.hpp"

namespace {

using troupe::errc;
using troupe::sim::trace_file;
using troupe::sim::trace_format;
using troupe::sim::trace_request;

const char* const sharegpt_lengths = "traces/length_stats/sharegpt_8k_filtered_stats_llama2_tokenizer.csv";
std::string burstgpt_sample() { return troupe::testing::test_data("traces/burstgpt/burstgpt_sample.csv"); }
std::string vidur_sample() { return troupe::testing::test_data("traces/vidur/vidur_requests_sample.csv"); }
std::string sharegpt_head() {
  return troupe::testing::test_data("traces/length_stats/sharegpt_8k_filtered_stats_llama2_tokenizer_head100.csv");
}
std::string mooncake_head() {
  return troupe::testing::test_data("traces/mooncake/conversation_trace_head300.jsonl");
}
std::string azure_head() {
  return troupe::testing::test_data("traces/azure_llm_2023/AzureLLMInferenceTrace_conv_head300.csv");
}

trace_file load_ok(const std::string& path, std::optional<trace_format> format = std::nullopt) {
  auto file = troupe::sim::load_trace(path, format);
  EXPECT_TRUE(file.has_value()) << (file ? "" : file.error().message);
  return file ? *file : trace_file{};
}

/// (arrival_ns, input, output) of each request.
std::vector<std::vector<int64_t>> rows_of(const trace_file& f) {
  std::vector<std::vector<int64_t>> rows;
  for (const trace_request& r : f.requests) rows.push_back({r.arrival_ns, r.input_tokens, r.output_tokens});
  return rows;
}

/// Parses `content` as `format` (nullopt: detected) and requires the error "PATH:LINE: ...what...".
void expect_malformed(std::optional<trace_format> format, const std::string& content, int line,
                      const std::string& what) {
  const std::string path = "mem.csv";
  auto file = troupe::sim::parse_trace_file(content, format, path);
  ASSERT_FALSE(file.has_value()) << what << ": parsed";
  EXPECT_EQ(file.error().code, errc::malformed_file) << file.error().message;
  const std::string prefix = line > 0 ? path + ":" + std::to_string(line) + ": " : path + ": ";
  EXPECT_EQ(file.error().message.rfind(prefix, 0), 0u) << file.error().message;
  EXPECT_NE(file.error().message.find(what), std::string::npos) << file.error().message;
}

// ---------------------------------------------------------------------------------------------
// The formats

TEST(BurstGptTrace, SampleRowsFailedRowSkipped) {
  const trace_file f = load_ok(burstgpt_sample());
  EXPECT_EQ(f.format, trace_format::burstgpt);
  EXPECT_EQ(f.num_skipped, 1);  // 118,GPT-4,417,0,...: 0 response tokens = a failed request
  const std::vector<std::vector<int64_t>> expected = {{0, 472, 18},
                                                      {40'000'000'000, 1087, 230},
                                                      {113'000'000'000, 2012, 57},
                                                      {126'500'000'000, 88, 301},
                                                      {3'595'000'000'000, 6, 1}};
  EXPECT_EQ(rows_of(f), expected);
}

TEST(VidurTrace, SampleRowsDecimalSecondsExactly) {
  const trace_file f = load_ok(vidur_sample());
  EXPECT_EQ(f.format, trace_format::vidur);
  const std::vector<std::vector<int64_t>> expected = {{0, 1024, 128},
                                                      {10'000, 37, 512},            // 1e-05 s
                                                      {250'000'001, 4096, 1},       // 0.2500000005 s, half up
                                                      {12'500'000'000, 9, 9}};      // 1.25e1 s
  EXPECT_EQ(rows_of(f), expected);
}

TEST(VidurTrace, DecimalSecondsRounding) {
  const std::pair<const char*, int64_t> cases[] = {
      {"0.1234567894", 123'456'789}, {"0.1234567895", 123'456'790}, {"0.0000000004999", 0},
      {"0.0000000005", 1},          {"1E+2", 100'000'000'000},     {"2.", 2'000'000'000},
      {".5", 500'000'000},          {"0e50", 0},                    {"1e-12", 0},
      {"999999999.999999999", 999'999'999'999'999'999}};
  for (const auto& [seconds, ns] : cases) {
    const std::string text = std::string("arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n") + seconds + ",1,1\n";
    auto f = troupe::sim::parse_trace_file(text, trace_format::vidur, "mem.csv");
    ASSERT_TRUE(f) << seconds << ": " << f.error().message;
    EXPECT_EQ(f->requests.at(1).arrival_ns, ns) << seconds;
  }
}

TEST(LengthsDataset, ShareGptHeadRowsNoArrivals) {
  const trace_file f = load_ok(sharegpt_head());
  EXPECT_EQ(f.format, trace_format::lengths);
  EXPECT_FALSE(troupe::sim::has_arrival_times(f.format));
  ASSERT_EQ(f.requests.size(), 100u);
  EXPECT_EQ(rows_of(f).front(), (std::vector<int64_t>{0, 74, 918}));
  EXPECT_EQ(rows_of(f).back(), (std::vector<int64_t>{0, 1182, 227}));  // 1182,227,1409,5.20704845814978
  for (const trace_request& r : f.requests) EXPECT_EQ(r.arrival_ns, 0);
}

TEST(LengthsDataset, FullShareGptFile) {
  TROUPE_SHARED_DATA_OR_SKIP(path, sharegpt_lengths);
  const trace_file f = load_ok(path);
  EXPECT_EQ(f.format, trace_format::lengths);
  ASSERT_EQ(f.requests.size(), 30731u);
  EXPECT_EQ(rows_of(f).front(), (std::vector<int64_t>{0, 74, 918}));
}

TEST(LengthsDataset, ArrivalsAreTheSyntheticProcess) {
  // The arrivals drawn for a length-only dataset are those of a synthetic workload with the
  // same rate, cv and seed: one arrival process, two sources of lengths.
  troupe::sim::synthetic_options s;
  s.num_requests = 100;
  s.rate_per_s = 5;
  s.cv = 2;
  s.seed = 11;
  const std::vector<trace_request> synthetic = troupe::sim::synthetic_workload(s);
  std::vector<trace_request> lengths = load_ok(sharegpt_head()).requests;
  troupe::sim::draw_arrivals(lengths, troupe::sim::arrival_process{5, 2, 11});
  ASSERT_EQ(lengths.size(), synthetic.size());
  for (size_t i = 0; i < lengths.size(); ++i) EXPECT_EQ(lengths[i].arrival_ns, synthetic[i].arrival_ns) << i;
  EXPECT_EQ(lengths[0].arrival_ns, 0);
  EXPECT_GT(lengths[99].arrival_ns, lengths[1].arrival_ns);
  EXPECT_EQ(lengths[0].input_tokens, 74);  // lengths untouched
  EXPECT_NE(troupe::sim::validate(troupe::sim::arrival_process{0, 1, 0}).error().message.find("rate_per_s"),
            std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Detection and names

TEST(TraceDetect, EachFormatFromItsFirstLine) {
  EXPECT_EQ(load_ok(azure_head()).format, trace_format::azure);
  EXPECT_EQ(load_ok(mooncake_head()).format, trace_format::mooncake);
  EXPECT_EQ(load_ok(burstgpt_sample()).format, trace_format::burstgpt);
  EXPECT_EQ(load_ok(vidur_sample()).format, trace_format::vidur);
  EXPECT_EQ(load_ok(sharegpt_head()).format, trace_format::lengths);
  // A named format is read as that format: a Vidur file read as lengths ignores arrived_at.
  const trace_file as_lengths = load_ok(vidur_sample(), trace_format::lengths);
  EXPECT_EQ(as_lengths.format, trace_format::lengths);
  EXPECT_EQ(as_lengths.requests.at(3).arrival_ns, 0);
  for (const char* name : {"azure", "mooncake", "burstgpt", "vidur", "lengths"})
    EXPECT_STREQ(troupe::sim::trace_format_name(troupe::sim::parse_trace_format(name).value()), name);
  EXPECT_EQ(troupe::sim::parse_trace_format("sharegpt").error().message,
            "unknown trace format 'sharegpt'; expected azure, mooncake, burstgpt, vidur or lengths");
}

TEST(TraceDetect, UnknownHeaderListsEveryFormat) {
  expect_malformed(std::nullopt, "\n time,prompt,output\n1,2,3\n", 2,
                   "cannot tell the trace format from ' time,prompt,output': expected a Mooncake JSON object or the "
                   "header of azure (TIMESTAMP, ContextTokens, GeneratedTokens), burstgpt (Timestamp, Request "
                   "tokens, Response tokens), vidur (arrived_at, num_prefill_tokens, num_decode_tokens), lengths "
                   "(num_prefill_tokens, num_decode_tokens); or name it (--format)");
  expect_malformed(std::nullopt, "\r\n\n", 0, "empty");
  expect_malformed(trace_format::vidur, "num_prefill_tokens,num_decode_tokens\n1,2\n", 1,
                   "header has no column arrived_at (header: 'num_prefill_tokens,num_decode_tokens')");
}

// ---------------------------------------------------------------------------------------------
// Malformed files: every error names the line and the column

TEST(BurstGptParse, EachErrorNamesLineAndColumn) {
  const std::string header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\r\n";
  const std::string row = "5,ChatGPT,472,18,490,Conversation log\r\n";
  expect_malformed(std::nullopt, header + row + "6,ChatGPT,4x2,18,490,Conversation log\r\n", 3,
                   "column 3 (Request tokens) is not an integer: '4x2'");
  expect_malformed(std::nullopt, header + row + "-6,ChatGPT,42,18,60,API log\r\n", 3,
                   "column 1 (Timestamp) is not a non-negative decimal number of seconds: '-6'");
  expect_malformed(std::nullopt, header + row + "4,ChatGPT,42,18,60,API log\r\n", 3,
                   "column 1 (Timestamp) '4' is earlier than the previous row's");
  expect_malformed(std::nullopt, header + row + "7,ChatGPT,0,18,18,API log\r\n", 3,
                   "column 3 (Request tokens) must be >= 1, got 0");
  expect_malformed(std::nullopt, header + row + "7,ChatGPT,1,-2,18,API log\r\n", 3,
                   "column 4 (Response tokens) must be >= 1, got -2");
  expect_malformed(std::nullopt, header + row + "7,ChatGPT,1,2\r\n", 3,
                   "expected 6 comma-separated fields, got 4 (truncated line?)");
  expect_malformed(std::nullopt, header + "7,GPT-4,417,0,417,Conversation log\r\n", 0,
                   "no requests after the header");  // every row failed
}

TEST(VidurParse, EachErrorNamesLineAndColumn) {
  const std::string header = "arrived_at,num_prefill_tokens,num_decode_tokens\n";
  expect_malformed(std::nullopt, header + "0.5,10,10\n1e,10,10\n", 3,
                   "column 1 (arrived_at) is not a non-negative decimal number of seconds: '1e'");
  expect_malformed(std::nullopt, header + "0.5,10,10\n1e101,10,10\n", 3, "column 1 (arrived_at) is not a non-negative");
  expect_malformed(std::nullopt, header + "1e9,10,10\n", 2,
                   "column 1 (arrived_at) is out of range (over 10^9 seconds): '1e9'");
  expect_malformed(std::nullopt, header + ",10,10\n", 2, "column 1 (arrived_at) is empty");
  expect_malformed(std::nullopt, header + "0,10.0,10\n", 2, "column 2 (num_prefill_tokens) is not an integer: '10.0'");
  expect_malformed(std::nullopt, header + "0,10,99999999999999999999\n", 2,
                   "column 3 (num_decode_tokens) is out of range: '99999999999999999999'");
}

TEST(LengthsParse, EachErrorNamesLineAndColumn) {
  const std::string header = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n";
  expect_malformed(std::nullopt, header + "74,918,992,0.08\n290,,1195,0.32\n", 3, "column 2 (num_decode_tokens) is empty");
  expect_malformed(std::nullopt, header + "74,918,992,0.08\n2147483648,1,1,1\n", 3,
                   "column 1 (num_prefill_tokens) 2147483648 exceeds 2147483647");
  expect_malformed(std::nullopt, header + "74,918,992\n", 2, "expected 4 comma-separated fields, got 3");
  expect_malformed(std::nullopt, header, 0, "no requests after the header");
}

// ---------------------------------------------------------------------------------------------
// troupe trace stats

TEST(TraceStats, BurstGptSampleByHand) {
  const trace_file f = load_ok(burstgpt_sample());
  const troupe::sim::trace_stats s = troupe::sim::compute_trace_stats(f, 0);
  EXPECT_EQ(s.num_requests, 5);
  EXPECT_EQ(s.duration_ns, 3'595'000'000'000);
  EXPECT_EQ(s.bucket_ns, 180'000'000'000);  // 3595 s / 20, rounded up to whole seconds
  std::vector<int64_t> buckets(20, 0);
  buckets[0] = 4;  // 0, 40, 113, 126.5 s
  buckets[19] = 1;  // 3595 s
  EXPECT_EQ(s.arrivals_per_bucket, buckets);
  // Prompts 6, 88, 472, 1087, 2012: numpy's p90 = 1087 + 0.6 * 925, p99 = 1087 + 0.96 * 925.
  EXPECT_EQ(s.input.min, 6);
  EXPECT_EQ(s.input.max, 2012);
  EXPECT_EQ(s.input.mean, 733);
  EXPECT_EQ(s.input.p50, 472);
  EXPECT_DOUBLE_EQ(s.input.p90, 1642);
  EXPECT_DOUBLE_EQ(s.input.p99, 1975);
  EXPECT_EQ(s.output.p50, 57);  // outputs 1, 18, 57, 230, 301
  EXPECT_FALSE(s.reuse);
  const std::string text = troupe::sim::format_trace_stats(s, "b.csv");
  EXPECT_EQ(text.substr(0, text.find('\n', text.find('\n', text.find('\n') + 1) + 1) + 1),
            "b.csv (burstgpt): 5 requests, 1 failed rows skipped\n"
            "arrivals over 3595.000 s: 0.001113 requests/s on average\n"
            "request rate over time (buckets of 180 s):\n");
  EXPECT_NE(text.find("\n           0          4      0.02222\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\n        3420          1     0.005556\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nprompt tokens  min 6  mean 733.0  p50 472.0  p90 1642.0  p99 1975.0  max 2012\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(troupe::sim::compute_trace_stats(f, 1'000'000'000'000).arrivals_per_bucket,
            (std::vector<int64_t>{4, 0, 0, 1}));
}

TEST(TraceStats, MooncakePrefixReuseBoundAndLengthOnly) {
  const trace_file f = load_ok(mooncake_head());
  const troupe::sim::trace_stats s = troupe::sim::compute_trace_stats(f, 0);
  ASSERT_TRUE(s.reuse);
  const troupe::sim::prefix_reuse bound = troupe::sim::prefix_reuse_bound(f.requests, 512);
  EXPECT_EQ(s.reuse->num_reusable_tokens, bound.num_reusable_tokens);
  EXPECT_GT(bound.num_reusable_tokens, 0);
  EXPECT_NE(troupe::sim::format_trace_stats(s, "m").find("prefix reuse bound (hash_ids, 512-token blocks, infinite "
                                                          "cache): "),
            std::string::npos);
  const troupe::sim::trace_stats lengths = troupe::sim::compute_trace_stats(load_ok(sharegpt_head()), 0);
  EXPECT_FALSE(lengths.timed);
  EXPECT_TRUE(lengths.arrivals_per_bucket.empty());
  EXPECT_NE(troupe::sim::format_trace_stats(lengths, "s").find("no arrival times"), std::string::npos);
}

TEST(TraceStatsCli, PrintsTheStatsAndNamesBadFiles) {
  const auto dir = std::filesystem::temp_directory_path() / ("troupe_trace_stats_cli_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const troupe::testing::cli_result r = troupe::testing::run_troupe({"trace", "stats", burstgpt_sample()}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const trace_file f = load_ok(burstgpt_sample());
  EXPECT_EQ(r.out, troupe::sim::format_trace_stats(troupe::sim::compute_trace_stats(f, 0), burstgpt_sample()));
  const troupe::testing::cli_result bad =
      troupe::testing::run_troupe({"trace", "stats", "--format", "vidur", burstgpt_sample()}, dir);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.out, "");
  EXPECT_NE(bad.err.find(burstgpt_sample() + ":1: header has no column arrived_at"), std::string::npos) << bad.err;
  // --out: the plots' data (and the SVGs, where gnuplot is installed).
  const auto plots = dir / "plots";
  const troupe::testing::cli_result plotted =
      troupe::testing::run_troupe({"trace", "stats", burstgpt_sample(), "--out", plots.string()}, dir);
  ASSERT_EQ(plotted.exit_code, 0) << plotted.err;
  EXPECT_EQ(troupe::testing::read_file((plots / "prompt_cdf.dat").string()), "6 0.2\n88 0.4\n472 0.6\n1087 0.8\n2012 1\n");
  const std::string rate = troupe::testing::read_file((plots / "rate.dat").string());
  EXPECT_EQ(std::count(rate.begin(), rate.end(), '\n'), 20);
  EXPECT_EQ(rate.substr(0, rate.find('\n')), "0.000000 0.022222");
  EXPECT_TRUE(std::filesystem::exists(plots / "trace_stats.gp"));
  std::filesystem::remove_all(dir);
}

}  // namespace
