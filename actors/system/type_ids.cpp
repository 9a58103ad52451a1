#include "actors/system/type_ids.hpp"

#include <caf/actor_system_config.hpp>

#include "actors/system/cluster_messages.hpp"
#include "actors/system/protocols.hpp"
#include "actors/system/scheduler.hpp"
#include "messages/client.hpp"
#include "messages/control.hpp"
#include "messages/engine.hpp"
#include "messages/executor.hpp"
#include "messages/expert.hpp"

namespace troupe::actors {

void register_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<msg::completion_request>("troupe::completion_request");
  cfg.add_message_type<msg::completion_chunk>("troupe::completion_chunk");
  cfg.add_message_type<msg::completion_end>("troupe::completion_end");
  cfg.add_message_type<msg::completion_error>("troupe::completion_error");
  cfg.add_message_type<msg::cancel_request>("troupe::cancel_request");
  cfg.add_message_type<msg::submit>("troupe::submit");
  cfg.add_message_type<msg::rejected>("troupe::rejected");
  cfg.add_message_type<msg::sampled>("troupe::sampled");
  cfg.add_message_type<msg::sampled_batch>("troupe::sampled_batch");
  cfg.add_message_type<msg::release>("troupe::release");
  cfg.add_message_type<msg::engine_report>("troupe::engine_report");
  cfg.add_message_type<msg::submit_completion>("troupe::submit_completion");
  cfg.add_message_type<msg::place_request>("troupe::place_request");
  cfg.add_message_type<msg::placement>("troupe::placement");
  cfg.add_message_type<msg::submit_prefill>("troupe::submit_prefill");
  cfg.add_message_type<msg::prefilled>("troupe::prefilled");
  cfg.add_message_type<msg::kv_handoff>("troupe::kv_handoff");
  cfg.add_message_type<msg::kv_arrived>("troupe::kv_arrived");
  cfg.add_message_type<msg::report_to>("troupe::report_to");
  cfg.add_message_type<msg::tier_report_to>("troupe::tier_report_to");
  cfg.add_message_type<msg::load_report>("troupe::load_report");
  cfg.add_message_type<msg::engine_lost>("troupe::engine_lost");
  cfg.add_message_type<msg::forwarded>("troupe::forwarded");
  cfg.add_message_type<engine::exec_plan>("troupe::exec_plan");
  cfg.add_message_type<engine::exec_result>("troupe::exec_result");
  cfg.add_message_type<msg::tier_lookup>("troupe::tier_lookup");
  cfg.add_message_type<msg::tier_put>("troupe::tier_put");
  cfg.add_message_type<msg::tier_get>("troupe::tier_get");
  cfg.add_message_type<msg::tier_got>("troupe::tier_got");
  cfg.add_message_type<msg::tier_fetch>("troupe::tier_fetch");
  cfg.add_message_type<msg::tier_blocks>("troupe::tier_blocks");
  cfg.add_message_type<msg::tier_report>("troupe::tier_report");
  cfg.add_message_type<msg::tier_events>("troupe::tier_events");
  cfg.add_message_type<msg::disk_put>("troupe::disk_put");
  cfg.add_message_type<msg::disk_stored>("troupe::disk_stored");
  cfg.add_message_type<msg::disk_fetch>("troupe::disk_fetch");
  cfg.add_message_type<msg::disk_blocks>("troupe::disk_blocks");
  cfg.add_message_type<msg::disk_report>("troupe::disk_report");
  cfg.add_message_type<moe::expert_request>("troupe::expert_request");
  cfg.add_message_type<moe::expert_reply>("troupe::expert_reply");
  cfg.add_message_type<msg::fetch_experts>("troupe::fetch_experts");
  cfg.add_message_type<msg::expert_set>("troupe::expert_set");
  cfg.add_message_type<msg::drop_experts>("troupe::drop_experts");
  // Handles that travel as a whole message (answers): typed handles are not built-in types.
  cfg.add_message_type<request_actor>("troupe::request_actor");
  cfg.add_message_type<executor_actor>("troupe::executor_actor");
  cfg.add_message_type<engine_list>("troupe::engine_list");
  cfg.add_message_type<expert_shard_list>("troupe::expert_shard_list");
  cfg.add_message_type<cache_tier_actor>("troupe::cache_tier_actor");
}

void configure_real_time(caf::actor_system_config& cfg, int32_t compute_threads) {
  register_message_types(cfg);
  use_scheduler(cfg, plan_scheduler(hardware_cores(), compute_threads));
}

}  // namespace troupe::actors
