// The registry of scheduling policies (policy.hpp). A new policy: one file defining its
// factory, and one line in `policies` below.
#include "runtime/sched/policy.hpp"

namespace troupe::sched {

expected<std::unique_ptr<policy>> make_sjf(const policy_options& o);  // policy_sjf.cpp

namespace {

class priority_policy final : public policy {
 public:
  int64_t rank(const rank_input& s) const override { return s.priority; }
};

class fcfs_policy final : public policy {
 public:
  int64_t rank(const rank_input&) const override { return 0; }
};

expected<std::unique_ptr<policy>> make_priority(const policy_options&) { return std::make_unique<priority_policy>(); }
expected<std::unique_ptr<policy>> make_fcfs(const policy_options&) { return std::make_unique<fcfs_policy>(); }

struct entry {
  const char* name;
  expected<std::unique_ptr<policy>> (*make)(const policy_options&);
};

constexpr entry policies[] = {
    {"priority", &make_priority},
    {"fcfs", &make_fcfs},
    {"sjf", &make_sjf},
};

}  // namespace

expected<std::unique_ptr<policy>> make_policy(const policy_options& o) {
  for (const entry& p : policies)
    if (o.name == p.name) return p.make(o);
  std::string known;
  for (const std::string& name : policy_names()) known += (known.empty() ? "" : ", ") + name;
  return fail(errc::invalid_argument, "unknown scheduler '" + o.name + "'; known: " + known);
}

std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (const entry& p : policies) names.emplace_back(p.name);
  return names;
}

}  // namespace troupe::sched
