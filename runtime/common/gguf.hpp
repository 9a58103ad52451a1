#pragma once

/// GGUF, llama.cpp's model file format (version 3; the specification is ggml's docs/gguf.md):
/// a header, typed metadata key/value pairs, tensor descriptions, then aligned tensor data.
///
/// `parse_gguf` reads and validates the header, the metadata and the tensor descriptions of a
/// file in memory; it trusts nothing: every count and length is checked against the bytes that
/// remain, every tensor's data must lie inside the file, names are unique, and a malformed file
/// is an error naming the file and the byte offset or the tensor. `write_gguf` writes the subset
/// troupe produces (`troupe convert`, the tests' random models): scalar, string and array
/// metadata, and tensors of every type read.
///
/// Tensor types read: those the kernels compute in (kernels/cpu/quants.hpp: F32, F16, BF16,
/// Q8_0, Q4_0, Q4_K, Q5_K, Q6_K); any tensor can also be read as float32 (`tensor_floats`).

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/quants.hpp"
#include "runtime/common/error.hpp"
#include "runtime/common/string_table.hpp"

namespace troupe::model {

/// GGUF metadata value types (the numbers are the format's).
enum class gguf_type : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
  u64 = 10, i64 = 11, f64 = 12,
};

/// ggml tensor types troupe reads: the kernels' weight types (the numbers are ggml's).
using ggml_type = kernels::cpu::weight_type;

struct gguf_value;

/// An array's elements, held compactly (a tokenizer's 128,256 tokens and 280,147 merges are
/// two arrays): strings in a string_table, integers (booleans as 0 and 1) and floats in their
/// own vectors, arrays of arrays as values.
class gguf_array {
 public:
  gguf_array() = default;
  explicit gguf_array(gguf_type element) : element_(element) {}

  [[nodiscard]] gguf_type element() const { return element_; }
  [[nodiscard]] size_t size() const;
  /// Element i of an array of strings, integers (and booleans), floats, or arrays.
  [[nodiscard]] std::string_view string(size_t i) const;
  [[nodiscard]] int64_t integer(size_t i) const;
  [[nodiscard]] double number(size_t i) const;
  [[nodiscard]] const gguf_value& array(size_t i) const;
  /// Element i as a value of its own.
  [[nodiscard]] gguf_value item(size_t i) const;
  /// Appends `v`, of the element type.
  void push_back(const gguf_value& v);
  void push_string(std::string_view s);
  void reserve(size_t n);

 private:
  gguf_type element_ = gguf_type::u32;
  string_table strings_;
  std::vector<int64_t> integers_;
  std::vector<double> numbers_;
  std::vector<gguf_value> arrays_;
};

/// One metadata value. Integers of every width are held in `integer` (u64 values above
/// INT64_MAX are refused when read), floats in `number`; an array's elements are in `array`.
struct gguf_value {
  gguf_type type = gguf_type::u32;
  int64_t integer = 0;
  double number = 0;
  bool boolean = false;
  std::string text;
  gguf_array array;

  [[nodiscard]] static gguf_value of_int(gguf_type t, int64_t v);
  [[nodiscard]] static gguf_value of_float(float v);
  [[nodiscard]] static gguf_value of_string(std::string v);
  [[nodiscard]] static gguf_value of_array(gguf_type element, const std::vector<gguf_value>& items);
};

struct gguf_tensor {
  std::string name;
  std::vector<int64_t> dims;  ///< ggml order: dims[0] is the contiguous (row) dimension
  ggml_type type = ggml_type::f32;
  uint64_t offset = 0;  ///< from the start of the data section
  uint64_t num_bytes = 0;
  [[nodiscard]] int64_t num_elements() const;
};

struct gguf_file {
  uint32_t version = 3;
  std::map<std::string, gguf_value> metadata;
  std::vector<gguf_tensor> tensors;  ///< in file order
  uint64_t alignment = 32;
  uint64_t data_offset = 0;  ///< where the data section starts in the file

  /// The tensor called `name`, or nullptr.
  [[nodiscard]] const gguf_tensor* tensor(std::string_view name) const;
  /// Metadata lookups: an error (malformed_file, naming `source` and the key) when the key is
  /// absent or of another kind.
  [[nodiscard]] expected<int64_t> get_int(const std::string& key, const std::string& source) const;
  [[nodiscard]] expected<double> get_float(const std::string& key, const std::string& source) const;
  [[nodiscard]] expected<std::string> get_string(const std::string& key, const std::string& source) const;
  [[nodiscard]] expected<const gguf_array*> get_array(const std::string& key, gguf_type element,
                                                      const std::string& source) const;
};

/// Parses `bytes` (a whole file); `source` names it in errors.
[[nodiscard]] expected<gguf_file> parse_gguf(std::string_view bytes, const std::string& source);

/// Whether `bytes` start with GGUF's magic.
[[nodiscard]] bool is_gguf(std::string_view bytes);

/// The float32 values of tensor `t` of a file parsed from `bytes` (dequantized as ggml does).
[[nodiscard]] std::vector<float> tensor_floats(std::string_view bytes, const gguf_file& f, const gguf_tensor& t);

/// Where tensor `t`'s data starts in `bytes`.
[[nodiscard]] const uint8_t* tensor_data(std::string_view bytes, const gguf_file& f, const gguf_tensor& t);

/// A tensor to write: float32 data in ggml order (`dims[0]` contiguous, a multiple of the type's
/// block), stored as `type` by encode_row (ggml_encode.hpp).
struct gguf_tensor_data {
  std::string name;
  std::vector<int64_t> dims;
  const float* data = nullptr;
  ggml_type type = ggml_type::f32;
};

/// The IEEE half-precision number nearest `f` (ties to even; beyond the range: infinity).
[[nodiscard]] uint16_t float_to_half(float f);

/// A GGUF v3 file with `metadata` (in the order given) and `tensors`, 32-byte aligned.
[[nodiscard]] std::string write_gguf(const std::vector<std::pair<std::string, gguf_value>>& metadata,
                                     const std::vector<gguf_tensor_data>& tensors);

}  // namespace troupe::model
