#include "runtime/common/gguf.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "runtime/common/byte_reader.hpp"
#include "runtime/common/byte_writer.hpp"
#include "runtime/common/ggml_encode.hpp"

namespace troupe::model {
namespace {

constexpr char magic[4] = {'G', 'G', 'U', 'F'};
constexpr int max_array_depth = 4;
constexpr uint32_t max_dims = 4;                        // GGML_MAX_DIMS
constexpr int64_t max_tensor_elements = int64_t{1} << 40;
constexpr uint64_t max_alignment = 1 << 20;

/// The fewest bytes one value of type `t` takes in a file (bounds array lengths before reading).
uint64_t min_size(gguf_type t) {
  switch (t) {
    case gguf_type::u8: case gguf_type::i8: case gguf_type::boolean: return 1;
    case gguf_type::u16: case gguf_type::i16: return 2;
    case gguf_type::u32: case gguf_type::i32: case gguf_type::f32: return 4;
    case gguf_type::u64: case gguf_type::i64: case gguf_type::f64: case gguf_type::string: return 8;
    case gguf_type::array: return 12;
  }
  return 1;
}

bool known_type(uint32_t t) { return t <= static_cast<uint32_t>(gguf_type::f64); }

/// A parser over the file's bytes whose errors name the file and the offset.
class reader {
 public:
  reader(std::string_view bytes, const std::string& source) : in_(bytes), source_(source) {}

  tl::unexpected<error> bad(const std::string& what) const {
    return fail(errc::malformed_file, "GGUF file '" + source_ + "': " + what + " (at byte " +
                                          std::to_string(in_.offset()) + ")");
  }

  template <class T>
  expected<T> scalar(const char* what) {
    T v{};
    if (!in_.read(v)) return bad(std::string("truncated while reading ") + what);
    return v;
  }

  expected<std::string_view> string_view(const char* what) {
    auto n = scalar<uint64_t>(what);
    if (!n) return tl::unexpected(n.error());
    std::string_view s;
    if (*n > in_.remaining() || !in_.read_view(static_cast<size_t>(*n), s))
      return bad(std::string(what) + " claims " + std::to_string(*n) + " bytes, more than the file holds");
    return s;
  }

  expected<std::string> string(const char* what) { return string_view(what).map([](std::string_view s) { return std::string(s); }); }

  expected<gguf_value> value(gguf_type t, int depth) {
    gguf_value v;
    v.type = t;
    switch (t) {
      case gguf_type::u8: return integer<uint8_t>(v);
      case gguf_type::i8: return integer<int8_t>(v);
      case gguf_type::u16: return integer<uint16_t>(v);
      case gguf_type::i16: return integer<int16_t>(v);
      case gguf_type::u32: return integer<uint32_t>(v);
      case gguf_type::i32: return integer<int32_t>(v);
      case gguf_type::i64: return integer<int64_t>(v);
      case gguf_type::u64: {
        auto x = scalar<uint64_t>("a u64 value");
        if (!x) return tl::unexpected(x.error());
        if (*x > static_cast<uint64_t>(INT64_MAX)) return bad("a u64 value above 2^63 - 1");
        v.integer = static_cast<int64_t>(*x);
        return v;
      }
      case gguf_type::f32: {
        auto x = scalar<float>("an f32 value");
        if (!x) return tl::unexpected(x.error());
        v.number = *x;
        return v;
      }
      case gguf_type::f64: {
        auto x = scalar<double>("an f64 value");
        if (!x) return tl::unexpected(x.error());
        v.number = *x;
        return v;
      }
      case gguf_type::boolean: {
        auto x = scalar<uint8_t>("a bool value");
        if (!x) return tl::unexpected(x.error());
        if (*x > 1) return bad("a bool value " + std::to_string(*x) + " (not 0 or 1)");
        v.boolean = *x == 1;
        return v;
      }
      case gguf_type::string: {
        auto s = string("a string value");
        if (!s) return tl::unexpected(s.error());
        v.text = std::move(*s);
        return v;
      }
      case gguf_type::array: {
        if (depth >= max_array_depth) return bad("arrays nested deeper than " + std::to_string(max_array_depth));
        auto element = scalar<uint32_t>("an array's element type");
        if (!element) return tl::unexpected(element.error());
        if (!known_type(*element)) return bad("an array of unknown type " + std::to_string(*element));
        auto count = scalar<uint64_t>("an array's length");
        if (!count) return tl::unexpected(count.error());
        const auto e = static_cast<gguf_type>(*element);
        if (*count > in_.remaining() / min_size(e))
          return bad("an array claims " + std::to_string(*count) + " elements, more than the file holds");
        v.array = gguf_array(e);
        v.array.reserve(static_cast<size_t>(*count));
        for (uint64_t i = 0; i < *count; i++) {
          if (e == gguf_type::string) {  // straight into the array's buffer
            auto s = string_view("a string value");
            if (!s) return tl::unexpected(s.error());
            v.array.push_string(*s);
            continue;
          }
          auto item = value(e, depth + 1);
          if (!item) return tl::unexpected(item.error());
          v.array.push_back(*item);
        }
        return v;
      }
    }
    return bad("unknown value type");
  }

  [[nodiscard]] size_t offset() const { return in_.offset(); }
  [[nodiscard]] size_t remaining() const { return in_.remaining(); }

 private:
  template <class T>
  expected<gguf_value> integer(gguf_value v) {
    auto x = scalar<T>("an integer value");
    if (!x) return tl::unexpected(x.error());
    v.integer = static_cast<int64_t>(*x);
    return v;
  }

  byte_reader in_;
  const std::string& source_;
};

uint64_t align_up(uint64_t x, uint64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

void put_value(std::string& out, const gguf_value& v) {
  switch (v.type) {
    case gguf_type::u8: put<uint8_t>(out, static_cast<uint8_t>(v.integer)); break;
    case gguf_type::i8: put<int8_t>(out, static_cast<int8_t>(v.integer)); break;
    case gguf_type::u16: put<uint16_t>(out, static_cast<uint16_t>(v.integer)); break;
    case gguf_type::i16: put<int16_t>(out, static_cast<int16_t>(v.integer)); break;
    case gguf_type::u32: put<uint32_t>(out, static_cast<uint32_t>(v.integer)); break;
    case gguf_type::i32: put<int32_t>(out, static_cast<int32_t>(v.integer)); break;
    case gguf_type::u64: put<uint64_t>(out, static_cast<uint64_t>(v.integer)); break;
    case gguf_type::i64: put<int64_t>(out, v.integer); break;
    case gguf_type::f32: put<float>(out, static_cast<float>(v.number)); break;
    case gguf_type::f64: put<double>(out, v.number); break;
    case gguf_type::boolean: put<uint8_t>(out, v.boolean ? 1 : 0); break;
    case gguf_type::string: put_string(out, v.text); break;
    case gguf_type::array:
      put<uint32_t>(out, static_cast<uint32_t>(v.array.element()));
      put<uint64_t>(out, v.array.size());
      for (size_t i = 0; i < v.array.size(); i++) put_value(out, v.array.item(i));
      break;
  }
}

}  // namespace

gguf_value gguf_value::of_int(gguf_type t, int64_t v) {
  gguf_value x;
  x.type = t;
  x.integer = v;
  return x;
}

gguf_value gguf_value::of_float(float v) {
  gguf_value x;
  x.type = gguf_type::f32;
  x.number = v;
  return x;
}

gguf_value gguf_value::of_string(std::string v) {
  gguf_value x;
  x.type = gguf_type::string;
  x.text = std::move(v);
  return x;
}

gguf_value gguf_value::of_array(gguf_type element, const std::vector<gguf_value>& items) {
  gguf_value x;
  x.type = gguf_type::array;
  x.array = gguf_array(element);
  for (const gguf_value& item : items) x.array.push_back(item);
  return x;
}

namespace {

enum class element_kind { string, integer, number, array };

element_kind kind_of(gguf_type t) {
  switch (t) {
    case gguf_type::string: return element_kind::string;
    case gguf_type::f32: case gguf_type::f64: return element_kind::number;
    case gguf_type::array: return element_kind::array;
    default: return element_kind::integer;  // booleans too
  }
}

}  // namespace

size_t gguf_array::size() const {
  switch (kind_of(element_)) {
    case element_kind::string: return strings_.size();
    case element_kind::integer: return integers_.size();
    case element_kind::number: return numbers_.size();
    case element_kind::array: return arrays_.size();
  }
  return 0;
}

std::string_view gguf_array::string(size_t i) const {
  TROUPE_ASSERT(element_ == gguf_type::string);
  return strings_[i];
}

int64_t gguf_array::integer(size_t i) const {
  TROUPE_ASSERT(kind_of(element_) == element_kind::integer && i < integers_.size());
  return integers_[i];
}

double gguf_array::number(size_t i) const {
  TROUPE_ASSERT(kind_of(element_) == element_kind::number && i < numbers_.size());
  return numbers_[i];
}

const gguf_value& gguf_array::array(size_t i) const {
  TROUPE_ASSERT(element_ == gguf_type::array && i < arrays_.size());
  return arrays_[i];
}

gguf_value gguf_array::item(size_t i) const {
  switch (kind_of(element_)) {
    case element_kind::string: return gguf_value::of_string(std::string(string(i)));
    case element_kind::number: {
      gguf_value v = gguf_value::of_float(0);
      v.type = element_;
      v.number = number(i);
      return v;
    }
    case element_kind::array: return array(i);
    case element_kind::integer: break;
  }
  gguf_value v = gguf_value::of_int(element_, integer(i));
  v.boolean = element_ == gguf_type::boolean && v.integer == 1;
  return v;
}

void gguf_array::push_back(const gguf_value& v) {
  TROUPE_ASSERT_MSG(v.type == element_, "an array's elements are all of its element type");
  switch (kind_of(element_)) {
    case element_kind::string: push_string(v.text); break;
    case element_kind::integer: integers_.push_back(element_ == gguf_type::boolean ? int64_t{v.boolean} : v.integer); break;
    case element_kind::number: numbers_.push_back(v.number); break;
    case element_kind::array: arrays_.push_back(v); break;
  }
}

void gguf_array::push_string(std::string_view s) {
  TROUPE_ASSERT(element_ == gguf_type::string);
  strings_.push_back(s);
}

void gguf_array::reserve(size_t n) {
  switch (kind_of(element_)) {
    case element_kind::string: strings_.reserve(n); break;
    case element_kind::integer: integers_.reserve(n); break;
    case element_kind::number: numbers_.reserve(n); break;
    case element_kind::array: arrays_.reserve(n); break;
  }
}

int64_t gguf_tensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

const gguf_tensor* gguf_file::tensor(std::string_view name) const {
  for (const gguf_tensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

expected<const gguf_value*> find(const gguf_file& f, const std::string& key, const std::string& source) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end())
    return fail(errc::malformed_file, "GGUF file '" + source + "': no metadata key '" + key + "'");
  return &it->second;
}

bool is_integer(gguf_type t) {
  return t == gguf_type::u8 || t == gguf_type::i8 || t == gguf_type::u16 || t == gguf_type::i16 ||
         t == gguf_type::u32 || t == gguf_type::i32 || t == gguf_type::u64 || t == gguf_type::i64;
}

tl::unexpected<error> wrong_kind(const std::string& key, const std::string& source, const char* wanted) {
  return fail(errc::malformed_file, "GGUF file '" + source + "': metadata key '" + key + "' is not " + wanted);
}

}  // namespace

expected<int64_t> gguf_file::get_int(const std::string& key, const std::string& source) const {
  auto v = find(*this, key, source);
  if (!v) return tl::unexpected(v.error());
  if (!is_integer((*v)->type)) return wrong_kind(key, source, "an integer");
  return (*v)->integer;
}

expected<double> gguf_file::get_float(const std::string& key, const std::string& source) const {
  auto v = find(*this, key, source);
  if (!v) return tl::unexpected(v.error());
  if ((*v)->type != gguf_type::f32 && (*v)->type != gguf_type::f64) return wrong_kind(key, source, "a float");
  return (*v)->number;
}

expected<std::string> gguf_file::get_string(const std::string& key, const std::string& source) const {
  auto v = find(*this, key, source);
  if (!v) return tl::unexpected(v.error());
  if ((*v)->type != gguf_type::string) return wrong_kind(key, source, "a string");
  return (*v)->text;
}

expected<const gguf_array*> gguf_file::get_array(const std::string& key, gguf_type element,
                                                 const std::string& source) const {
  auto v = find(*this, key, source);
  if (!v) return tl::unexpected(v.error());
  if ((*v)->type != gguf_type::array || (*v)->array.element() != element)
    return wrong_kind(key, source, "an array of the expected element type");
  return &(*v)->array;
}

bool is_gguf(std::string_view bytes) { return bytes.size() >= 4 && std::memcmp(bytes.data(), magic, 4) == 0; }

expected<gguf_file> parse_gguf(std::string_view bytes, const std::string& source) {
  reader in(bytes, source);
  if (!is_gguf(bytes)) return in.bad("not a GGUF file (no 'GGUF' magic)");
  (void)in.scalar<uint32_t>("the magic");
  gguf_file f;
  auto version = in.scalar<uint32_t>("the version");
  if (!version) return tl::unexpected(version.error());
  if (*version != 2 && *version != 3)
    return in.bad("GGUF version " + std::to_string(*version) + " is not supported (2 and 3 are)");
  f.version = *version;
  auto num_tensors = in.scalar<uint64_t>("the tensor count");
  if (!num_tensors) return tl::unexpected(num_tensors.error());
  auto num_kv = in.scalar<uint64_t>("the metadata count");
  if (!num_kv) return tl::unexpected(num_kv.error());
  if (*num_kv > in.remaining() / (8 + 4 + 1) || *num_tensors > in.remaining() / (8 + 4 + 4 + 8))
    return in.bad("the header claims " + std::to_string(*num_kv) + " metadata entries and " +
                  std::to_string(*num_tensors) + " tensors, more than the file holds");
  for (uint64_t i = 0; i < *num_kv; i++) {
    auto key = in.string("a metadata key");
    if (!key) return tl::unexpected(key.error());
    auto type = in.scalar<uint32_t>("a metadata type");
    if (!type) return tl::unexpected(type.error());
    if (!known_type(*type)) return in.bad("metadata key '" + echo(*key) + "' has unknown type " + std::to_string(*type));
    auto value = in.value(static_cast<gguf_type>(*type), 0);
    if (!value) return tl::unexpected(value.error());
    if (!f.metadata.emplace(*key, std::move(*value)).second) return in.bad("metadata key '" + echo(*key) + "' appears twice");
  }
  if (auto it = f.metadata.find("general.alignment"); it != f.metadata.end()) {
    const gguf_value& a = it->second;
    if (!is_integer(a.type) || a.integer < 1 || static_cast<uint64_t>(a.integer) > max_alignment ||
        (a.integer & (a.integer - 1)) != 0)
      return in.bad("general.alignment must be a power of two up to " + std::to_string(max_alignment));
    f.alignment = static_cast<uint64_t>(a.integer);
  }
  std::set<std::string> names;
  for (uint64_t i = 0; i < *num_tensors; i++) {
    gguf_tensor t;
    auto name = in.string("a tensor name");
    if (!name) return tl::unexpected(name.error());
    t.name = std::move(*name);
    if (!names.insert(t.name).second) return in.bad("tensor '" + echo(t.name) + "' appears twice");
    auto n_dims = in.scalar<uint32_t>("a tensor's dimension count");
    if (!n_dims) return tl::unexpected(n_dims.error());
    if (*n_dims < 1 || *n_dims > max_dims)
      return in.bad("tensor '" + echo(t.name) + "' has " + std::to_string(*n_dims) + " dimensions (1 to 4 allowed)");
    int64_t elements = 1;
    for (uint32_t d = 0; d < *n_dims; d++) {
      auto dim = in.scalar<uint64_t>("a tensor dimension");
      if (!dim) return tl::unexpected(dim.error());
      if (*dim < 1 || *dim > static_cast<uint64_t>(max_tensor_elements) ||
          elements > max_tensor_elements / static_cast<int64_t>(*dim))
        return in.bad("tensor '" + echo(t.name) + "' has an empty or too large dimension");
      elements *= static_cast<int64_t>(*dim);
      t.dims.push_back(static_cast<int64_t>(*dim));
    }
    auto type = in.scalar<uint32_t>("a tensor type");
    if (!type) return tl::unexpected(type.error());
    namespace cpu = kernels::cpu;
    if (!cpu::is_weight_type(*type) || static_cast<ggml_type>(*type) == ggml_type::q8_k)
      return in.bad("tensor '" + echo(t.name) + "' has ggml type " + std::to_string(*type) +
                    ", which troupe does not read (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K are)");
    const auto wt = static_cast<ggml_type>(*type);
    if (t.dims[0] % cpu::block_elements(wt) != 0)
      return in.bad(std::string(cpu::type_name(wt)) + " tensor '" + echo(t.name) + "' has rows of " +
                    std::to_string(t.dims[0]) + " values, not a multiple of its block of " +
                    std::to_string(cpu::block_elements(wt)));
    t.num_bytes = static_cast<uint64_t>(cpu::row_bytes(wt, t.dims[0]) * (elements / t.dims[0]));
    t.type = static_cast<ggml_type>(*type);
    auto offset = in.scalar<uint64_t>("a tensor offset");
    if (!offset) return tl::unexpected(offset.error());
    if (*offset % f.alignment != 0)
      return in.bad("tensor '" + echo(t.name) + "' starts at data offset " + std::to_string(*offset) +
                    ", not a multiple of the alignment " + std::to_string(f.alignment));
    t.offset = *offset;
    f.tensors.push_back(std::move(t));
  }
  f.data_offset = align_up(in.offset(), f.alignment);
  const uint64_t data_size = bytes.size() >= f.data_offset ? bytes.size() - f.data_offset : 0;
  for (const gguf_tensor& t : f.tensors)
    if (t.offset > data_size || t.num_bytes > data_size - t.offset)
      return fail(errc::malformed_file, "GGUF file '" + source + "': tensor '" + echo(t.name) + "' (" +
                                            std::to_string(t.num_bytes) + " bytes at data offset " +
                                            std::to_string(t.offset) + ") runs past the end of the file (truncated?)");
  return f;
}

std::vector<float> tensor_floats(std::string_view bytes, const gguf_file& f, const gguf_tensor& t) {
  const int64_t n = t.num_elements(), row = t.dims[0];
  std::vector<float> out(static_cast<size_t>(n));
  const uint8_t* p = tensor_data(bytes, f, t);
  for (int64_t i = 0; i < n / row; i++, p += kernels::cpu::row_bytes(t.type, row))
    kernels::cpu::dequantize_row(out.data() + i * row, p, t.type, static_cast<int32_t>(row));
  return out;
}

const uint8_t* tensor_data(std::string_view bytes, const gguf_file& f, const gguf_tensor& t) {
  return reinterpret_cast<const uint8_t*>(bytes.data()) + f.data_offset + t.offset;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u);  // infinity, NaN
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and above round to infinity
  if (x < 0x38800000u) {                         // below 2^-14: a subnormal half, in units of 2^-24
    float magnitude;
    std::memcpy(&magnitude, &x, sizeof magnitude);
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 16777216.0f));  // exact product
  }
  uint32_t h = ((x >> 23) - 127 + 15) << 10 | (x & 0x7fffffu) >> 13;
  const uint32_t rest = x & 0x1fffu;  // the 13 mantissa bits dropped
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;  // a carry rounds into the exponent
  return sign | static_cast<uint16_t>(h);
}

std::string write_gguf(const std::vector<std::pair<std::string, gguf_value>>& metadata,
                       const std::vector<gguf_tensor_data>& tensors) {
  constexpr uint64_t alignment = 32;
  std::string out;
  put_bytes(out, magic, 4);
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors.size());
  put<uint64_t>(out, metadata.size());
  for (const auto& [key, value] : metadata) {
    put_string(out, key);
    put<uint32_t>(out, static_cast<uint32_t>(value.type));
    put_value(out, value);
  }
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const gguf_tensor_data& t : tensors) {
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
    int64_t n = 1;
    for (int64_t d : t.dims) {
      put<uint64_t>(out, static_cast<uint64_t>(d));
      n *= d;
    }
    TROUPE_ASSERT_MSG(t.dims[0] % kernels::cpu::block_elements(t.type) == 0, "rows are whole blocks");
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, offset);
    offsets.push_back(offset);
    offset = align_up(offset + static_cast<uint64_t>(kernels::cpu::row_bytes(t.type, n)), alignment);
  }
  out.resize(align_up(out.size(), alignment), '\0');
  const size_t data_start = out.size();
  for (size_t i = 0; i < tensors.size(); i++) {
    out.resize(data_start + offsets[i], '\0');
    int64_t n = 1;
    for (int64_t d : tensors[i].dims) n *= d;
    const int64_t row = tensors[i].dims[0];
    for (int64_t r = 0; r < n; r += row) encode_row(out, tensors[i].data + r, row, tensors[i].type);
  }
  return out;
}

}  // namespace troupe::model
