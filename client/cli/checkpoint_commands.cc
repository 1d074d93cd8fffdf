// rackhubctl checkpoint create|list|delete|restore: the admin CheckpointService
// (rackhub.admin.v1) and the human rendering of its Checkpoint messages.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "command_tree.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"

namespace rackhub::cli {
namespace {

// CreateCheckpoint waits this long for the chunks when timeout_ms is 0.
constexpr uint32_t kDefaultSnapshotWaitMs = 10000;
// List rows name each key up to this many keys; more are summarized.
constexpr int kKeysNamedInList = 4;

// ---- Output ----------------------------------------------------------------

// "w@5, b@5" for a few keys; "120 keys @5" or "120 keys @3..5" for many;
// "none" without keys.
std::string KeysAtIterations(const admin::Checkpoint& c) {
  if (c.keys().empty()) return "none";
  if (c.keys_size() <= kKeysNamedInList) {
    std::string out;
    for (const auto& k : c.keys()) {
      out += (out.empty() ? "" : ", ") + k.key() + "@" + std::to_string(k.iteration());
    }
    return out;
  }
  uint64_t low = c.keys(0).iteration(), high = low;
  for (const auto& k : c.keys()) {
    low = std::min(low, k.iteration());
    high = std::max(high, k.iteration());
  }
  return std::to_string(c.keys_size()) + " keys @" + std::to_string(low) +
         (low == high ? "" : ".." + std::to_string(high));
}

// `field: value` block, then the per-key iterations as a table.
void PrintCheckpoint(std::ostream& out, const admin::Checkpoint& c) {
  FieldBlock block;
  block.Add("tenant", c.tenant());
  block.Add("sequence", std::to_string(c.sequence()));
  block.Add("path", c.path());
  block.Add("created", FormatUnixMs(c.created_unix_ms()));
  block.Add("size", BytesWithHuman(c.bytes()));
  if (!c.problem().empty()) block.Add("problem", c.problem());
  block.Add("keys", std::to_string(c.keys_size()));
  block.Print(out);
  Table table({{"KEY"}, {"ITERATION", true}});
  for (const auto& k : c.keys()) table.AddRow({k.key(), std::to_string(k.iteration())});
  PrintSection(out, "key iterations", table);
}

void PrintCheckpointList(std::ostream& out, const std::string& tenant,
                         const admin::ListCheckpointsResponse& response) {
  Table table({{"SEQUENCE", true}, {"CREATED"}, {"SIZE", true}, {"KEYS@ITERATION"}, {"PROBLEM"}});
  std::string damaged;  // "3, 2"
  int damaged_count = 0;
  for (const auto& c : response.checkpoints()) {  // newest first, as the daemon sends them
    const bool bad = !c.problem().empty();
    if (bad) {
      damaged += (damaged.empty() ? "" : ", ") + std::to_string(c.sequence());
      ++damaged_count;
    }
    table.AddRow({std::to_string(c.sequence()), FormatUnixMs(c.created_unix_ms()),
                  BytesWithHuman(c.bytes()), bad ? "-" : KeysAtIterations(c),
                  bad ? "DAMAGED: " + c.problem() : "-"});
  }
  table.Print(out, "", "no checkpoints of tenant '" + tenant + "'");
  if (damaged_count > 0) {
    const bool one = damaged_count == 1;
    out << "\n"
        << (one ? "checkpoint " : "checkpoints ") << damaged
        << (one ? " is damaged: it is" : " are damaged: they are")
        << " never restored (restore without SEQUENCE skips " << (one ? "it" : "them")
        << "); `rackhubctl checkpoint delete " << tenant << " SEQUENCE` removes a file.\n";
  }
}

// ---- Commands --------------------------------------------------------------

using CheckpointStub = admin::CheckpointService::Stub;

// TENANT [SEQUENCE]: the checkpoint a command is about.
struct CheckpointRef {
  std::string tenant;
  uint64_t sequence = 0;
};

// A request for `ref.tenant` (and its sequence, if given).
template <typename Request>
Request ForCheckpoint(const Invocation& inv, const CheckpointRef& ref) {
  Request request;
  request.set_tenant(ref.tenant);
  if (Given(inv.command, "SEQUENCE")) request.set_sequence(ref.sequence);
  return request;
}

CLI::Option* AddCheckpointRef(CLI::App* command, CheckpointRef* ref, const std::string& sequence) {
  AddArgument(command, "TENANT", &ref->tenant, "tenant name");
  return command
      ->add_option("SEQUENCE", ref->sequence, "the checkpoint's sequence number " + sequence)
      ->type_name("")
      ->check(PositiveU64Validator());
}

// Shows a Checkpoint the daemon returned: `headline`, then the checkpoint.
template <typename Headline>
auto ShowCheckpoint(Headline headline) {
  return [headline](std::ostream& out, const admin::Checkpoint& checkpoint) {
    headline(out, checkpoint);
    PrintCheckpoint(out, checkpoint);
  };
}

void AddCreate(CLI::App* checkpoint, Handlers* handlers) {
  struct Args {
    std::string tenant;
    uint32_t timeout_ms = 0;
  };
  const auto c = DefineCommand<Args>(
      checkpoint, "create", "checkpoint a tenant now (training goes on); prints the new file",
      "Writes the tenant's parameters and optimizer state, every chunk of a key at one\n"
      "iteration, and prints the new checkpoint: sequence, path on the hub's host, size\n"
      "and each key's iteration. It returns once the file is on disk; the oldest beyond\n"
      "the daemon's checkpoint.keep are deleted. --timeout-ms bounds the wait for every\n"
      "chunk to reach one iteration per key (DEADLINE_EXCEEDED if a worker stalls); the\n"
      "call's own deadline is --timeout plus that wait.");
  AddArgument(c.app, "TENANT", &c.args->tenant, "tenant name");
  c.app
      ->add_option("--timeout-ms", c.args->timeout_ms,
                   "wait at most N ms for the chunks (default 10000; at most 3600000)")
      ->type_name("N")
      ->check(U32Validator());
  Handle(handlers, c, [](const Invocation& inv, const Args& a) {
    admin::CreateCheckpointRequest request;
    request.set_tenant(a.tenant);
    if (Given(inv.command, "--timeout-ms")) request.set_timeout_ms(a.timeout_ms);
    // The daemon may wait for the chunks before it writes: --timeout is for
    // the rest of the call.
    const uint32_t wait_ms = a.timeout_ms == 0 ? kDefaultSnapshotWaitMs : a.timeout_ms;
    return CallAndShow(inv, &CheckpointStub::CreateCheckpoint, request,
                       ShowCheckpoint([](std::ostream& out, const admin::Checkpoint& r) {
                         out << "created checkpoint " << r.sequence() << " of tenant '"
                             << r.tenant() << "'\n";
                       }),
                       std::chrono::milliseconds(wait_ms));
  });
}

void AddList(CLI::App* checkpoint, Handlers* handlers) {
  const auto c = DefineCommand<std::string>(
      checkpoint, "list", "list a tenant's checkpoints, newest first; damaged files say why",
      "Columns: sequence, creation time, size on disk, each key's iteration (a summary\n"
      "for more than 4 keys; --json has them all) and PROBLEM: why a damaged file cannot\n"
      "be loaded (it is listed, never restored).");
  AddArgument(c.app, "TENANT", c.args.get(), "tenant name");
  Handle(handlers, c, [](const Invocation& inv, const std::string& tenant) {
    admin::ListCheckpointsRequest request;
    request.set_tenant(tenant);
    return CallAndShow(
        inv, &CheckpointStub::ListCheckpoints, request,
        [&tenant](std::ostream& out, const admin::ListCheckpointsResponse& response) {
          PrintCheckpointList(out, tenant, response);
        });
  });
}

void AddDelete(CLI::App* checkpoint, Handlers* handlers) {
  const auto c =
      DefineCommand<CheckpointRef>(checkpoint, "delete", "delete one checkpoint file of a tenant");
  AddCheckpointRef(c.app, c.args.get(), "(see list)")->required();
  Handle(handlers, c, [](const Invocation& inv, const CheckpointRef& ref) {
    return CallAndShow(inv, &CheckpointStub::DeleteCheckpoint,
                       ForCheckpoint<admin::DeleteCheckpointRequest>(inv, ref),
                       [&ref](std::ostream& out, const admin::DeleteCheckpointResponse&) {
                         out << "deleted checkpoint " << ref.sequence << " of tenant '"
                             << ref.tenant << "'\n";
                       });
  });
}

void AddRestore(CLI::App* checkpoint, Handlers* handlers) {
  const auto c = DefineCommand<CheckpointRef>(
      checkpoint, "restore",
      "put the running tenant back to a checkpoint (default: the newest valid one)",
      "The tenant's pending updates fail (WORKER_LOST); its workers' next pushes get\n"
      "BAD_ITERATION carrying the restored iteration, and they pull and continue from\n"
      "there. Without SEQUENCE the newest checkpoint that verifies is used (damaged\n"
      "ones are skipped); a given SEQUENCE must exist and verify.");
  AddCheckpointRef(c.app, c.args.get(), "(default: newest)");
  Handle(handlers, c, [](const Invocation& inv, const CheckpointRef& ref) {
    return CallAndShow(inv, &CheckpointStub::RestoreCheckpoint,
                       ForCheckpoint<admin::RestoreCheckpointRequest>(inv, ref),
                       ShowCheckpoint([](std::ostream& out, const admin::Checkpoint& r) {
                         out << "restored tenant '" << r.tenant() << "' to checkpoint "
                             << r.sequence() << "; its workers resume from these iterations\n";
                       }));
  });
}

}  // namespace

void AddCheckpointCommands(CLI::App* checkpoint, Handlers* handlers) {
  AddCreate(checkpoint, handlers);
  AddList(checkpoint, handlers);
  AddDelete(checkpoint, handlers);
  AddRestore(checkpoint, handlers);
}

}  // namespace rackhub::cli
