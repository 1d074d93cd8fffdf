#include "commands.h"

#include <algorithm>

#include "format.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"

namespace rackhub::cli {
namespace {

const std::vector<std::string> kOptimizerOptions = {
    "optimizer", "lr",      "momentum", "weight-decay",       "beta1",
    "beta2",     "epsilon", "initial-accumulator", "reduction"};

const std::vector<std::string> kQuotaOptions = {"max-param-bytes", "max-keys", "max-workers"};

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Emits `message` as JSON or through `human`.
template <typename Message, typename Human>
int Emit(const Invocation& inv, const Message& message, Human human) {
  if (inv.connection.options().json) {
    PrintJson(inv.out, message);
  } else {
    human();
  }
  return kExitOk;
}

// ---- Option values -------------------------------------------------------

bool AnyOptimizerOption(const CommandLine& cl) {
  return std::any_of(kOptimizerOptions.begin(), kOptimizerOptions.end(),
                     [&cl](const std::string& name) { return cl.Has(name); });
}

admin::OptimizerType ParseOptimizerType(const std::string& text) {
  return ParseChoice<admin::OptimizerType>("optimizer", text,
                                           {{"sgd", admin::SGD},
                                            {"momentum", admin::MOMENTUM},
                                            {"nesterov", admin::NESTEROV},
                                            {"adam", admin::ADAM},
                                            {"adamw", admin::ADAMW},
                                            {"adagrad", admin::ADAGRAD},
                                            {"sum-only", admin::SUM_ONLY}});
}

// Overlays the optimizer options of `cl` on `base`.
admin::Optimizer ApplyOptimizerOptions(const CommandLine& cl, admin::Optimizer base) {
  if (auto v = cl.Get("optimizer")) base.set_type(ParseOptimizerType(*v));
  if (auto v = cl.Get("lr")) base.set_learning_rate(ParseDouble("lr", *v));
  if (auto v = cl.Get("momentum")) base.set_momentum(ParseDouble("momentum", *v));
  if (auto v = cl.Get("weight-decay")) base.set_weight_decay(ParseDouble("weight-decay", *v));
  if (auto v = cl.Get("beta1")) base.set_beta1(ParseDouble("beta1", *v));
  if (auto v = cl.Get("beta2")) base.set_beta2(ParseDouble("beta2", *v));
  if (auto v = cl.Get("epsilon")) base.set_epsilon(ParseDouble("epsilon", *v));
  if (auto v = cl.Get("initial-accumulator")) {
    base.set_initial_accumulator(ParseDouble("initial-accumulator", *v));
  }
  if (auto v = cl.Get("reduction")) {
    base.set_reduction(ParseChoice<admin::GradientReduction>(
        "reduction", *v, {{"mean", admin::MEAN}, {"sum", admin::SUM}}));
  }
  return base;
}

// On create the optimizer is given in full: hyperparameters without a type
// would be ambiguous.
void RequireOptimizerType(const CommandLine& cl, const std::string& command) {
  if (!AnyOptimizerOption(cl) || cl.Has("optimizer")) return;
  for (const auto& name : kOptimizerOptions) {
    if (cl.Has(name)) {
      throw UsageError(command + ": --" + name + " needs --optimizer TYPE");
    }
  }
}

admin::Quotas ParseQuotas(const CommandLine& cl) {
  admin::Quotas q;
  if (auto v = cl.Get("max-param-bytes")) q.set_max_parameter_bytes(ParseSize("max-param-bytes", *v));
  if (auto v = cl.Get("max-keys")) q.set_max_keys(ParseU32("max-keys", *v));
  if (auto v = cl.Get("max-workers")) q.set_max_workers(ParseU32("max-workers", *v));
  return q;
}

// ---- Tenant commands -----------------------------------------------------

int TenantCreate(const Invocation& inv) {
  admin::CreateTenantRequest request;
  request.set_name(inv.args[0]);
  request.set_workers_per_rack(ParseU32("workers", *inv.cl.Get("workers")));
  if (auto v = inv.cl.Get("chunk-bytes")) request.set_chunk_bytes(ParseSize32("chunk-bytes", *v));
  RequireOptimizerType(inv.cl, "tenant create");
  if (AnyOptimizerOption(inv.cl)) {
    *request.mutable_default_optimizer() = ApplyOptimizerOptions(inv.cl, {});
  }
  *request.mutable_quotas() = ParseQuotas(inv.cl);
  if (auto path = inv.cl.Get("tenant-token-file")) {
    // The same tenant on every rack's hub shares one data-plane token.
    request.set_token(Trim(ReadLocalFile("tenant-token-file", *path)));
  }

  auto stub = admin::TenantService::NewStub(inv.connection.channel());
  grpc::ClientContext context;
  inv.connection.Prepare(&context);
  admin::CreateTenantResponse response;
  Check(stub->CreateTenant(&context, request, &response), inv.connection);
  return Emit(inv, response, [&] {
    inv.out << "created tenant '" << response.tenant().name() << "'\n";
    PrintTenant(inv.out, response.tenant());
    inv.out << "\ndata-plane token: " << response.token() << "\n"
            << "This token is shown only once (the daemon keeps only a hash of it): store it now.\n";
  });
}

int TenantGet(const Invocation& inv) {
  admin::GetTenantRequest request;
  request.set_name(inv.args[0]);
  auto stub = admin::TenantService::NewStub(inv.connection.channel());
  grpc::ClientContext context;
  inv.connection.Prepare(&context);
  admin::Tenant response;
  Check(stub->GetTenant(&context, request, &response), inv.connection);
  return Emit(inv, response, [&] { PrintTenant(inv.out, response); });
}

int TenantList(const Invocation& inv) {
  auto stub = admin::TenantService::NewStub(inv.connection.channel());
  grpc::ClientContext context;
  inv.connection.Prepare(&context);
  admin::ListTenantsResponse response;
  Check(stub->ListTenants(&context, admin::ListTenantsRequest(), &response), inv.connection);
  return Emit(inv, response, [&] { PrintTenantList(inv.out, response); });
}

int TenantUpdateQuotas(const Invocation& inv) {
  admin::UpdateQuotasRequest request;
  request.set_name(inv.args[0]);
  if (std::none_of(kQuotaOptions.begin(), kQuotaOptions.end(),
                   [&](const std::string& name) { return inv.cl.Has(name); })) {
    throw UsageError(
        "tenant update-quotas: give at least one of --max-param-bytes, --max-keys, "
        "--max-workers");
  }
  *request.mutable_quotas() = ParseQuotas(inv.cl);
  auto stub = admin::TenantService::NewStub(inv.connection.channel());
  grpc::ClientContext context;
  inv.connection.Prepare(&context);
  admin::Tenant response;
  Check(stub->UpdateQuotas(&context, request, &response), inv.connection);
  return Emit(inv, response, [&] {
    inv.out << "updated the quotas of tenant '" << response.name() << "'\n";
    PrintTenant(inv.out, response);
  });
}

int TenantDelete(const Invocation& inv) {
  admin::DeleteTenantRequest request;
  request.set_name(inv.args[0]);
  auto stub = admin::TenantService::NewStub(inv.connection.channel());
  grpc::ClientContext context;
  inv.connection.Prepare(&context);
  admin::DeleteTenantResponse response;
  Check(stub->DeleteTenant(&context, request, &response), inv.connection);
  return Emit(inv, response,
              [&] { inv.out << "deleted tenant '" << request.name() << "'\n"; });
}

// ---- Key commands --------------------------------------------------------

admin::Key GetKey(const Invocation& inv, admin::KeyService::Stub* stub) {
  admin::GetKeyRequest request;
  request.set_tenant(inv.args[0]);
  request.set_name(inv.args[1]);
  grpc::ClientContext context;
  inv.connection.Prepare(&context);
  admin::Key response;
  Check(stub->GetKey(&context, request, &response), inv.connection);
  return response;
}

int KeyCreate(const Invocation& inv) {
  admin::CreateKeyRequest request;
  request.set_tenant(inv.args[0]);
  request.set_name(inv.args[1]);
  request.set_elements(ParseU64("elements", *inv.cl.Get("elements")));
  if (auto v = inv.cl.Get("dtype")) {
    request.set_dtype(ParseChoice<admin::DType>(
        "dtype", *v, {{"fp32", admin::FP32}, {"fp16", admin::FP16}, {"bf16", admin::BF16}}));
  }
  if (auto v = inv.cl.Get("init")) {
    request.set_init(ParseChoice<admin::InitMode>(
        "init", *v, {{"zeros", admin::ZEROS}, {"client", admin::FROM_CLIENT}}));
  }
  RequireOptimizerType(inv.cl, "key create");
  if (AnyOptimizerOption(inv.cl)) *request.mutable_optimizer() = ApplyOptimizerOptions(inv.cl, {});

  auto stub = admin::KeyService::NewStub(inv.connection.channel());
  grpc::ClientContext context;
  inv.connection.Prepare(&context);
  admin::Key response;
  Check(stub->CreateKey(&context, request, &response), inv.connection);
  return Emit(inv, response, [&] {
    inv.out << "created key '" << response.name() << "' in tenant '" << response.tenant()
            << "'\n";
    PrintKey(inv.out, response, /*chunks=*/true);
  });
}

int KeyGet(const Invocation& inv) {
  auto stub = admin::KeyService::NewStub(inv.connection.channel());
  const admin::Key key = GetKey(inv, stub.get());
  return Emit(inv, key, [&] { PrintKey(inv.out, key, /*chunks=*/true); });
}

int KeyList(const Invocation& inv) {
  admin::ListKeysRequest request;
  request.set_tenant(inv.args[0]);
  auto stub = admin::KeyService::NewStub(inv.connection.channel());
  grpc::ClientContext context;
  inv.connection.Prepare(&context);
  admin::ListKeysResponse response;
  Check(stub->ListKeys(&context, request, &response), inv.connection);
  return Emit(inv, response, [&] { PrintKeyList(inv.out, request.tenant(), response); });
}

int KeyDelete(const Invocation& inv) {
  admin::DeleteKeyRequest request;
  request.set_tenant(inv.args[0]);
  request.set_name(inv.args[1]);
  auto stub = admin::KeyService::NewStub(inv.connection.channel());
  grpc::ClientContext context;
  inv.connection.Prepare(&context);
  admin::DeleteKeyResponse response;
  Check(stub->DeleteKey(&context, request, &response), inv.connection);
  return Emit(inv, response, [&] {
    inv.out << "deleted key '" << request.name() << "' from tenant '" << request.tenant()
            << "'\n";
  });
}

// Options not given keep the key's current values: the current optimizer is
// read first and the given options are laid over it. When --optimizer names
// another type nothing is carried over (the daemon decides whether the change
// is allowed).
int KeySetOptimizer(const Invocation& inv) {
  if (!AnyOptimizerOption(inv.cl)) {
    throw UsageError("key set-optimizer: give at least one optimizer option (e.g. --lr X)");
  }
  // Parse everything before talking to the daemon.
  const admin::Optimizer given = ApplyOptimizerOptions(inv.cl, {});
  auto stub = admin::KeyService::NewStub(inv.connection.channel());
  const admin::Key current = GetKey(inv, stub.get());
  admin::Optimizer base = current.optimizer();
  if (inv.cl.Has("optimizer") && given.type() != base.type()) base = admin::Optimizer();
  admin::SetOptimizerRequest request;
  request.set_tenant(inv.args[0]);
  request.set_name(inv.args[1]);
  *request.mutable_optimizer() = ApplyOptimizerOptions(inv.cl, base);

  grpc::ClientContext context;
  inv.connection.Prepare(&context);
  admin::Key response;
  Check(stub->SetOptimizer(&context, request, &response), inv.connection);
  return Emit(inv, response, [&] {
    inv.out << "updated the optimizer of key '" << response.name() << "' in tenant '"
            << response.tenant() << "'\n";
    PrintKey(inv.out, response, /*chunks=*/false);
  });
}

// ---- Stats ---------------------------------------------------------------

int Stats(const Invocation& inv) {
  admin::GetStatsRequest request;
  if (!inv.args.empty()) request.set_tenant(inv.args[0]);
  auto stub = admin::StatsService::NewStub(inv.connection.channel());
  grpc::ClientContext context;
  inv.connection.Prepare(&context);
  admin::GetStatsResponse response;
  Check(stub->GetStats(&context, request, &response), inv.connection);
  return Emit(inv, response, [&] { PrintStats(inv.out, response); });
}

const std::vector<CommandSpec>& Commands() {
  static const std::vector<CommandSpec> commands = {
      {{"tenant", "create"}, {"NAME"}, 0,
       Concat(Concat({"workers", "chunk-bytes", "tenant-token-file"}, kOptimizerOptions),
              kQuotaOptions),
       {"workers"}, TenantCreate},
      {{"tenant", "get"}, {"NAME"}, 0, {}, {}, TenantGet},
      {{"tenant", "list"}, {}, 0, {}, {}, TenantList},
      {{"tenant", "update-quotas"}, {"NAME"}, 0, kQuotaOptions, {}, TenantUpdateQuotas},
      {{"tenant", "delete"}, {"NAME"}, 0, {}, {}, TenantDelete},
      {{"key", "create"}, {"TENANT", "NAME"}, 0,
       Concat({"elements", "dtype", "init"}, kOptimizerOptions), {"elements"}, KeyCreate},
      {{"key", "get"}, {"TENANT", "NAME"}, 0, {}, {}, KeyGet},
      {{"key", "list"}, {"TENANT"}, 0, {}, {}, KeyList},
      {{"key", "delete"}, {"TENANT", "NAME"}, 0, {}, {}, KeyDelete},
      {{"key", "set-optimizer"}, {"TENANT", "NAME"}, 0, kOptimizerOptions, {}, KeySetOptimizer},
      {{"stats"}, {"TENANT"}, 1, {}, {}, Stats},
  };
  return commands;
}

std::string Join(const std::vector<std::string>& words, const char* sep) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : sep) + w;
  return out;
}

}  // namespace

const std::vector<std::string>& GlobalOptions() {
  static const std::vector<std::string> options = {
      "admin", "token-file", "tls-ca", "tls-cert", "tls-key", "tls-server-name", "json", "timeout"};
  return options;
}

const CommandSpec& ResolveCommand(const CommandLine& cl, std::vector<std::string>* args) {
  const auto& words = cl.words;
  if (words.empty()) throw UsageError("no command given");
  const CommandSpec* found = nullptr;
  std::vector<std::string> subcommands;
  for (const auto& spec : Commands()) {
    if (spec.words[0] != words[0]) continue;
    if (spec.words.size() == 1) {
      found = &spec;
      break;
    }
    subcommands.push_back(spec.words[1]);
    if (words.size() >= 2 && spec.words[1] == words[1]) {
      found = &spec;
      break;
    }
  }
  if (found == nullptr) {
    if (subcommands.empty()) throw UsageError("unknown command '" + words[0] + "'");
    if (words.size() < 2) {
      throw UsageError("'" + words[0] + "' needs a subcommand: " + Join(subcommands, ", "));
    }
    throw UsageError("unknown command '" + words[0] + " " + words[1] +
                     "' (expected one of: " + Join(subcommands, ", ") + ")");
  }
  const std::string name = Join(found->words, " ");
  args->assign(words.begin() + static_cast<std::ptrdiff_t>(found->words.size()), words.end());
  if (args->size() > found->args.size()) {
    throw UsageError(name + ": unexpected argument '" + (*args)[found->args.size()] + "'");
  }
  if (args->size() + found->optional_args < found->args.size()) {
    throw UsageError(name + ": missing " + found->args[args->size()]);
  }
  for (const auto& [option, value] : cl.options) {
    const auto& global = GlobalOptions();
    if (std::find(global.begin(), global.end(), option) != global.end()) continue;
    if (std::find(found->options.begin(), found->options.end(), option) == found->options.end()) {
      throw UsageError("option --" + option + " does not apply to '" + name + "'");
    }
  }
  for (const auto& option : found->required) {
    if (!cl.Has(option)) throw UsageError(name + ": missing required option --" + option);
  }
  return *found;
}

}  // namespace rackhub::cli
