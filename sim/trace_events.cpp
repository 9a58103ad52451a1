#include "sim/trace_events.hpp"

#include <fstream>

namespace troupe::sim {
namespace {

/// Nanoseconds as microseconds with exactly three decimals ("1234.005"): no rounding.
std::string us(int64_t ns) {
  std::string frac = std::to_string(ns % 1000);
  return std::to_string(ns / 1000) + "." + std::string(3 - frac.size(), '0') + frac;
}

/// Replica r is process r + 1; the requests are process 0.
std::string pid_of(int32_t replica) { return std::to_string(replica + 1); }

/// A JSON string: the names written here are ASCII words; quotes and backslashes are escaped.
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

void metadata(std::string& out, const std::string& kind, const std::string& pid, int tid, const std::string& name) {
  out += "{\"name\":\"" + kind + "\",\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":" + std::to_string(tid) +
         ",\"args\":{\"name\":" + quote(name) + "}},\n";
}

void async(std::string& out, const char* phase, const std::string& name, int64_t id, int64_t ns, const std::string& args) {
  out += "{\"name\":" + quote(name) + ",\"cat\":\"request\",\"ph\":\"" + phase + "\",\"pid\":0,\"tid\":0,\"id\":" +
         std::to_string(id) + ",\"ts\":" + us(ns) + (args.empty() ? "" : ",\"args\":{" + args + "}") + "},\n";
}

/// A nested async slice [from, to) of request `id`, if both ends happened.
void phase(std::string& out, const std::string& name, int64_t id, int64_t from, int64_t to) {
  if (from < 0 || to < 0) return;
  async(out, "b", name, id, from, "");
  async(out, "e", name, id, to, "");
}

}  // namespace

std::string trace_events_json(const sim_result& r) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  metadata(out, "process_name", "0", 0, "requests");
  for (int32_t i = 0; i < r.num_replicas; i++) {
    metadata(out, "process_name", pid_of(i), 0, "engine" + std::to_string(i));
    metadata(out, "thread_name", pid_of(i), 1, "executor");
  }
  for (const step_record& s : r.steps)
    out += "{\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"pid\":" + pid_of(s.replica) + ",\"tid\":1,\"ts\":" +
           us(s.start_ns) + ",\"dur\":" + us(s.duration_ns) + ",\"args\":{\"step\":" + std::to_string(s.step) +
           ",\"rows\":" + std::to_string(s.num_rows) + ",\"decode_rows\":" + std::to_string(s.num_decode_rows) +
           ",\"prefill_tokens\":" + std::to_string(s.num_prefill_tokens) + ",\"samples\":" +
           std::to_string(s.num_samples) + "}},\n";
  for (const replica_sample& s : r.samples)
    out += "{\"name\":\"requests\",\"ph\":\"C\",\"pid\":" + pid_of(s.replica) + ",\"ts\":" + us(s.time_ns) +
           ",\"args\":{\"waiting\":" + std::to_string(s.num_waiting) + ",\"running\":" + std::to_string(s.num_running) +
           "}},\n{\"name\":\"kv_blocks_in_use\",\"ph\":\"C\",\"pid\":" + pid_of(s.replica) + ",\"ts\":" + us(s.time_ns) +
           ",\"args\":{\"blocks\":" + std::to_string(s.num_blocks_in_use) + "}},\n";
  for (const request_record& q : r.requests) {
    const std::string name = "request " + std::to_string(q.index);
    async(out, "b", name, q.index, q.arrival_ns,
          "\"prompt_tokens\":" + std::to_string(q.prompt_tokens) + ",\"output_tokens\":" +
              std::to_string(q.output_tokens) + ",\"cached_tokens\":" + std::to_string(q.cached_tokens) +
              ",\"preemptions\":" + std::to_string(q.preemptions) + ",\"finish\":" + quote(q.finish));
    phase(out, "queued", q.index, q.arrival_ns, q.scheduled_ns);
    phase(out, "prefill", q.index, q.scheduled_ns, q.first_token_ns);
    phase(out, "decode", q.index, q.first_token_ns, q.finish_ns);
    async(out, "e", name, q.index, q.finish_ns, "");
  }
  out.erase(out.size() - 2);  // the last ",\n" (the "requests" process name is always there)
  return out + "\n]}\n";
}

expected<void> write_trace_events(const std::string& path, const sim_result& r) {
  std::ofstream out(path, std::ios::binary);
  out << trace_events_json(r);
  if (!out) return fail(errc::io_error, "cannot write the trace " + path);
  return {};
}

}  // namespace troupe::sim
