#pragma once

// Subcommands of the `troupe` CLI. Each registers its options on the app and returns the
// action to run when it was chosen; the action returns the process exit code (0 ok, 2 error).

#include <functional>
#include <istream>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <caf/fwd.hpp>

#include "actors/system/tls.hpp"
#include "messages/client.hpp"
#include "runtime/common/error.hpp"
#include "runtime/jinja/options.hpp"
#include "runtime/tokenizer/tokenizer.hpp"
#include "runtime/spec/spec_config.hpp"

namespace troupe::topology {
struct engine_spec;
}

namespace troupe::cli {

using action = std::function<int()>;

/// The bundled file at `relative` (e.g. "models/tok512.bin"): under <exe dir>/../share/troupe
/// when troupe is installed there, else under the source tree it was built from.
std::string bundled_path(const std::string& relative);
/// The bundled model and tokenizer (models/), resolved by bundled_path.
std::string default_model_path();
std::string default_tokenizer_path();
/// The tokenizer a command loads: `given` (-z) when it is not empty, else the model file itself
/// when it is a GGUF file (it carries its vocabulary), else the bundled one.
std::string tokenizer_path_for(const std::string& given, const std::string& model);
/// The help text of `-z` (generate, serve).
std::string tokenizer_flag_help();
/// The default topology (examples/single-node.toml), resolved by bundled_path.
std::string default_topology_path();

/// "troupe VERSION (git COMMIT)": the CMake project version and the commit it was built from
/// ("unknown" outside a git checkout).
std::string version_text();
/// "troupe-VERSION-COMMIT": the HTTP gateway's system_fingerprint.
std::string system_fingerprint();

/// Logs `e` to stderr and returns the error exit code.
int fail_with(const error& e);

/// `code`, for a command to return after a failure with `sys` still up; over TLS, ends the
/// process with `code` at once instead (stdio flushed, no destructors): CAF 0.17's OpenSSL
/// module spins on a handshake that a frozen peer never answers, and stopping the middleman
/// then waits for that multiplexer thread forever (docs/security.md, known limitations).
int leave(const caf::actor_system& sys, int code);

/// The flags that describe one completion, shared by `generate` and `client`.
struct completion_flags {
  std::string prompt;
  int32_t max_tokens = 256;
  float temperature = 1.0f;
  float top_p = 0.9f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  uint64_t seed = 0;
  bool seed_given = false;
  std::vector<std::string> stop;
  bool ignore_eos = false;   ///< generate past end-of-sequence tokens (exact lengths, for benchmarks)
  std::string json_schema;   ///< grammar-constrained output (docs/grammars.md): at most one
  std::string regex;
  std::string grammar_file;  ///< GBNF

  void add_to(CLI::App* cmd);
  [[nodiscard]] msg::completion_request to_request() const;
};

/// Speculative decoding flags of the commands that run a generated one-node topology.
struct speculation_flags {
  std::string drafter = "none";
  int32_t num_speculative_tokens = 4;
  int32_t draft_layers = 1;
  std::string draft_model;
  std::string mode = "fixed";

  /// Adds them to `cmd`, in `group`; returns them.
  std::vector<CLI::Option*> add_to(CLI::App* cmd, const std::string& group = "Speculative decoding");
  /// Sets `config` (an engine's speculation) from them; a bad drafter name is an error.
  [[nodiscard]] expected<void> apply(spec::speculation_config& config) const;
};

/// A chunk callback printing each chunk's text to stdout (flushed), preceded once by `echo`
/// (the prompt, or "" for none): echoing on the first chunk keeps stdout empty when a request
/// is rejected.
std::function<void(const msg::completion_chunk&)> chunk_printer(std::string echo);

/// Accepts exactly the decimal integers a uint64_t holds: CLI11 alone would wrap "-1" to 2^64 - 1
/// and clamp 2^64 and beyond to it.
CLI::Validator seed_validator();

/// The generated engine's flags (generate, serve -m): `--threads N`, its kernel threads (the
/// topology's `executor_threads` and its bounds; no short form: -t is the temperature), and
/// `--ctx-size N` (alias `--max-model-len`), the longest context a request may have (prompt and
/// output; default the model's, clipped so that the weights and the KV of one such request fit
/// in 90% of MemAvailable), the KV pool growing to hold one such request, and
/// `--kv-cache-dtype f32|f16|q8_0` (the topology's `kv_cache_dtype`), `--layout-cache DIR|off`
/// (the topology's `layout_cache`).
struct engine_flags {
  int32_t threads = 1;
  int32_t ctx_size = 0;        ///< 0 = the model's context length
  std::string kv_cache_dtype;  ///< "": by the weights (model::default_kv_dtype)
  std::string layout_cache;    ///< "": the user's cache directory
  /// The flags, for a group or an exclusion.
  std::vector<CLI::Option*> add_to(CLI::App* cmd);
  void apply(topology::engine_spec& e) const;
};

/// `--chat-template FILE` and `--template-date YYYY-MM-DD` (serve, node, render-chat).
struct chat_template_flags {
  std::string file;  ///< "": none (the model's own template)
  std::string date;  ///< "": today (UTC)

  void add_to(CLI::App* cmd);
  /// The file's text when one is given (at most jinja::limits::template_bytes_max bytes).
  [[nodiscard]] expected<std::optional<std::string>> read_file() const;
  /// --template-date, or today's date read from the clock here, at the app layer (runtime/
  /// never reads one).
  [[nodiscard]] expected<jinja::civil_date> resolve_date() const;
};

/// The vocabulary of GGUF file `path` (its tokenizer.ggml.* and tokenizer.chat_template
/// metadata; no tensor is read): tokenize and render-chat.
[[nodiscard]] expected<tokenizer> load_gguf_tokenizer(const std::string& path);

/// Reads all of `in` (stdin), refusing more than `bytes_max` bytes (errc::too_long, naming
/// `what` and the bound).
[[nodiscard]] expected<std::string> read_bounded(std::istream& in, size_t bytes_max, const std::string& what);

/// Raises the soft limit on open files to the hard limit: at the limit, CAF 0.17's acceptor
/// spins on accept() failing with EMFILE (docs/resources.md).
void raise_open_file_limit();

/// Sends CAF's own printing (`aout`) to stderr: stdout carries only completion text.
void keep_stdout_for_text(caf::actor_system& sys);

/// HOST:PORT of --connect, checked (a port in 1..65535).
[[nodiscard]] expected<std::pair<std::string, uint16_t>> parse_address(const std::string& address);

/// "60s", "500ms", "2m" or a bare number of seconds, in milliseconds (within an int32).
[[nodiscard]] expected<int32_t> parse_duration_ms(const std::string& text);

/// A client process's actor system configuration (real time, the network with `tls`); warns
/// when it will talk to a host that is not loopback in plaintext.
[[nodiscard]] expected<void> configure_client(caf::actor_system_config& cfg, const actors::tls_credentials& tls,
                                              const std::string& address);

/// --ca, --certificate and --key (PEM files, all three or none): connect with mutual TLS.
void add_tls_flags(CLI::App* cmd, actors::tls_credentials& tls);

/// A seed for this process's load balancer: drawn here, outside the deterministic core.
uint64_t draw_seed_base();

action add_generate(CLI::App& app);
action add_serve(CLI::App& app);
action add_node(CLI::App& app);
action add_up(CLI::App& app);
action add_client(CLI::App& app);
action add_drain(CLI::App& app);
action add_calibrate(CLI::App& app);
action add_sim(CLI::App& app);
action add_trace(CLI::App& app);
action add_certs(CLI::App& app);
action add_bench(CLI::App& app);
action add_convert(CLI::App& app);
action add_tokenize(CLI::App& app);
action add_render_chat(CLI::App& app);
action add_quantize(CLI::App& app);
action add_moe_split(CLI::App& app);

}  // namespace troupe::cli
