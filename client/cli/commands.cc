#include "commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "command_tree.h"
#include "format.h"
#include "help.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"

namespace rackhub::cli {

CLI::App* AddCommand(CLI::App* parent, const std::string& name, const std::string& summary,
                     const std::string& details) {
  CLI::App* command = parent->add_subcommand(name, summary);
  command->footer(details.empty() ? std::string(kCommandFooter)
                                  : details + "\n\n" + kCommandFooter);
  return command;
}

CLI::Option* AddArgument(CLI::App* command, const std::string& name, std::string* value,
                         const std::string& what) {
  return command->add_option(name, *value, what)->type_name("")->required();
}

bool Given(const CLI::App& command, const std::string& option) {
  return command.count(option) > 0;
}

namespace {

const std::vector<std::pair<std::string, admin::OptimizerType>> kOptimizerTypes = {
    {"sgd", admin::SGD},   {"momentum", admin::MOMENTUM}, {"nesterov", admin::NESTEROV},
    {"adam", admin::ADAM}, {"adamw", admin::ADAMW},       {"adagrad", admin::ADAGRAD},
    {"sum-only", admin::SUM_ONLY}};
const std::vector<std::pair<std::string, admin::GradientReduction>> kReductions = {
    {"mean", admin::MEAN}, {"sum", admin::SUM}};
const std::vector<std::pair<std::string, admin::DType>> kDTypes = {
    {"fp32", admin::FP32}, {"fp16", admin::FP16}, {"bf16", admin::BF16}};
const std::vector<std::pair<std::string, admin::InitMode>> kInitModes = {
    {"zeros", admin::ZEROS}, {"client", admin::FROM_CLIENT}, {"random", admin::RANDOM}};

const std::vector<std::string> kOptimizerOptions = {
    "--optimizer", "--lr",      "--momentum",            "--weight-decay", "--beta1",
    "--beta2",     "--epsilon", "--initial-accumulator", "--reduction"};
const std::vector<std::string> kQuotaOptions = {"--max-param-bytes", "--max-keys",
                                                "--max-workers"};

constexpr const char* kOptimizerGroup = "Optimizer options";
constexpr const char* kQuotaGroup = "Quota options";

template <typename T>
std::vector<std::string> Names(const std::vector<std::pair<std::string, T>>& choices) {
  std::vector<std::string> names;
  for (const auto& [name, value] : choices) names.push_back(name);
  return names;
}

bool AnyGiven(const CLI::App& command, const std::vector<std::string>& options) {
  return std::any_of(options.begin(), options.end(),
                     [&command](const std::string& o) { return Given(command, o); });
}

// ---- Option groups shared by several commands -----------------------------

struct OptimizerArgs {
  std::string type, reduction;
  double lr = 0, momentum = 0, weight_decay = 0, beta1 = 0, beta2 = 0, epsilon = 0,
         initial_accumulator = 0;
};

// `create`: the optimizer is given in full, so hyperparameters without a type
// (which would be ambiguous) are refused while parsing.
void AddOptimizerOptions(CLI::App* command, OptimizerArgs* a, bool create) {
  command
      ->add_option("--optimizer", a->type,
                   "sgd, momentum, nesterov, adam, adamw, adagrad or sum-only")
      ->type_name("TYPE")
      ->check(OneOfValidator(Names(kOptimizerTypes)))
      ->group(kOptimizerGroup);
  const auto decimal = [&](const char* name, double* value, const char* what) {
    command->add_option(name, *value, what)
        ->type_name("X")
        ->check(DecimalValidator())
        ->group(kOptimizerGroup);
  };
  decimal("--lr", &a->lr, "learning rate (> 0; unused by sum-only)");
  decimal("--momentum", &a->momentum, "momentum, nesterov: in (0, 1)");
  decimal("--weight-decay", &a->weight_decay, ">= 0 (adamw: decoupled)");
  decimal("--beta1", &a->beta1, "adam, adamw: in [0, 1) (default 0.9)");
  decimal("--beta2", &a->beta2, "adam, adamw: in [0, 1) (default 0.999)");
  decimal("--epsilon", &a->epsilon, "adam, adamw, adagrad (default 1e-8; adagrad 1e-10)");
  decimal("--initial-accumulator", &a->initial_accumulator, "adagrad: >= 0");
  command
      ->add_option("--reduction", a->reduction,
                   "how the workers' gradients are combined (default mean)")
      ->type_name("mean|sum")
      ->check(OneOfValidator(Names(kReductions)))
      ->group(kOptimizerGroup);
  if (create) {
    command->callback([command] {
      if (Given(*command, "--optimizer")) return;
      for (const auto& name : kOptimizerOptions) {
        if (Given(*command, name)) {
          throw CLI::ValidationError(name, "needs --optimizer TYPE (on create the optimizer is "
                                           "given in full)");
        }
      }
    });
  }
}

// Overlays the optimizer options given to `command` on `base`.
admin::Optimizer ApplyOptimizerOptions(const CLI::App& command, const OptimizerArgs& a,
                                       admin::Optimizer base) {
  if (Given(command, "--optimizer")) base.set_type(*Choice(a.type, kOptimizerTypes));
  if (Given(command, "--lr")) base.set_learning_rate(a.lr);
  if (Given(command, "--momentum")) base.set_momentum(a.momentum);
  if (Given(command, "--weight-decay")) base.set_weight_decay(a.weight_decay);
  if (Given(command, "--beta1")) base.set_beta1(a.beta1);
  if (Given(command, "--beta2")) base.set_beta2(a.beta2);
  if (Given(command, "--epsilon")) base.set_epsilon(a.epsilon);
  if (Given(command, "--initial-accumulator")) base.set_initial_accumulator(a.initial_accumulator);
  if (Given(command, "--reduction")) base.set_reduction(*Choice(a.reduction, kReductions));
  return base;
}

struct QuotaArgs {
  uint64_t max_param_bytes = 0;
  uint32_t max_keys = 0, max_workers = 0, weight = 0;
};

void AddQuotaOptions(CLI::App* command, QuotaArgs* q) {
  command->add_option("--max-param-bytes", q->max_param_bytes,
                      "hub memory all keys may hold: fp32 parameters x2, optimizer state,\n"
                      "accumulators, parked contributions (Adam, 2 workers: ~6x the parameters)")
      ->type_name("SIZE")
      ->transform(SizeValidator())
      ->group(kQuotaGroup);
  command->add_option("--max-keys", q->max_keys, "number of keys")
      ->type_name("N")
      ->check(U32Validator())
      ->group(kQuotaGroup);
  command->add_option("--max-workers", q->max_workers, "workers per rack")
      ->type_name("N")
      ->check(U32Validator())
      ->group(kQuotaGroup);
  command->add_option("--weight", q->weight,
                      "share of each lane against other busy tenants (fair scheduler) [1]")
      ->type_name("N")
      ->check(CLI::Range(1, 1000))
      ->group(kQuotaGroup);
}

admin::Quotas ToQuotas(const CLI::App& command, const QuotaArgs& q) {
  admin::Quotas out;
  if (Given(command, "--max-param-bytes")) out.set_max_parameter_bytes(q.max_param_bytes);
  if (Given(command, "--max-keys")) out.set_max_keys(q.max_keys);
  if (Given(command, "--max-workers")) out.set_max_workers(q.max_workers);
  if (Given(command, "--weight")) out.set_weight(q.weight);
  return out;
}

// ---- Tenant commands -----------------------------------------------------

// --consistency sync|bounded:S|async.
Status SetConsistency(const std::string& text, admin::CreateTenantRequest* r) {
  if (text == "sync") {
    r->set_consistency(admin::SYNC);
    return Status::Ok();
  }
  if (text == "async") {
    r->set_consistency(admin::ASYNC);
    return Status::Ok();
  }
  const std::string num = text.rfind("bounded:", 0) == 0 ? text.substr(8) : std::string();
  const bool digits = !num.empty() && num.size() <= 7 &&
                      num.find_first_not_of("0123456789") == std::string::npos;
  if (!digits) {
    return InvalidArgument("--consistency: '" + text +
                           "' is not sync, async or bounded:S (S a whole number of iterations)");
  }
  r->set_consistency(admin::BOUNDED);
  r->set_staleness(static_cast<uint32_t>(std::stoul(num)));
  return Status::Ok();
}

void AddTenantCommands(CLI::App* tenant, std::map<const CLI::App*, Handler>* handlers) {
  {
    struct Args {
      std::string name, token_file, consistency;
      uint32_t workers = 0, chunk_bytes = 0;
      OptimizerArgs optimizer;
      QuotaArgs quotas;
    };
    auto a = std::make_shared<Args>();
    CLI::App* c = AddCommand(
        tenant, "create", "create a tenant; prints its data-plane token (shown only this once)",
        "Creates a tenant with N workers per rack and prints the tenant and its data-plane\n"
        "token: the token is shown only this once. Without optimizer options the default\n"
        "optimizer is sgd --lr 0.01; quotas left out (or 0) use the daemon's defaults.");
    AddArgument(c, "NAME", &a->name, "tenant name (1-63 of a-z 0-9 _ -)");
    c->add_option("--workers", a->workers, "workers per rack")
        ->type_name("N")
        ->check(U32Validator())
        ->required();
    c->add_option("--chunk-bytes", a->chunk_bytes,
                  "chunk size, a multiple of 64 in [1KiB, 64MiB] (default 32KiB)")
        ->type_name("SIZE")
        ->transform(Size32Validator());
    c->add_option("--tenant-token-file", a->token_file,
                  "use the token in FILE (32-128 of A-Z a-z 0-9 _ -) instead of minting one:\n"
                  "the same tenant on every rack's hub shares one token")
        ->type_name("FILE");
    c->add_option("--consistency", a->consistency,
                  "how workers wait for each other (default sync; docs/consistency.md)")
        ->type_name("sync|bounded:S|async");
    AddOptimizerOptions(c, &a->optimizer, /*create=*/true);
    AddQuotaOptions(c, &a->quotas);
    (*handlers)[c] = [a](const Invocation& inv) {
      admin::CreateTenantRequest request;
      request.set_name(a->name);
      if (Given(inv.command, "--consistency")) {
        if (Status s = SetConsistency(a->consistency, &request); !s.ok()) return s;
      }
      request.set_workers_per_rack(a->workers);
      if (Given(inv.command, "--chunk-bytes")) request.set_chunk_bytes(a->chunk_bytes);
      if (AnyGiven(inv.command, kOptimizerOptions)) {
        *request.mutable_default_optimizer() = ApplyOptimizerOptions(inv.command, a->optimizer, {});
      }
      *request.mutable_quotas() = ToQuotas(inv.command, a->quotas);
      if (Given(inv.command, "--tenant-token-file")) {
        const Result<std::string> token = ReadLocalFile("tenant-token-file", a->token_file);
        if (!token.ok()) return token.status();
        request.set_token(Trim(*token));
      }
      auto stub = admin::TenantService::NewStub(inv.connection.channel());
      grpc::ClientContext context;
      inv.connection.Prepare(&context);
      admin::CreateTenantResponse response;
      if (Status s = Check(stub->CreateTenant(&context, request, &response), inv.connection);
          !s.ok()) {
        return s;
      }
      return Emit(inv, response, [&] {
        inv.out << "created tenant '" << response.tenant().name() << "'\n";
        PrintTenant(inv.out, response.tenant());
        inv.out << "\ndata-plane token: " << response.token() << "\n"
                << "This token is shown only once (the daemon keeps only a hash of it): store it "
                   "now.\n";
      });
    };
  }
  {
    auto name = std::make_shared<std::string>();
    CLI::App* c = AddCommand(tenant, "get", "show one tenant");
    AddArgument(c, "NAME", name.get(), "tenant name");
    (*handlers)[c] = [name](const Invocation& inv) {
      admin::GetTenantRequest request;
      request.set_name(*name);
      auto stub = admin::TenantService::NewStub(inv.connection.channel());
      grpc::ClientContext context;
      inv.connection.Prepare(&context);
      admin::Tenant response;
      if (Status s = Check(stub->GetTenant(&context, request, &response), inv.connection); !s.ok()) {
        return s;
      }
      return Emit(inv, response, [&] { PrintTenant(inv.out, response); });
    };
  }
  {
    CLI::App* c = AddCommand(tenant, "list", "list all tenants");
    (*handlers)[c] = [](const Invocation& inv) {
      auto stub = admin::TenantService::NewStub(inv.connection.channel());
      grpc::ClientContext context;
      inv.connection.Prepare(&context);
      admin::ListTenantsResponse response;
      if (Status s = Check(stub->ListTenants(&context, admin::ListTenantsRequest(), &response),
                           inv.connection);
          !s.ok()) {
        return s;
      }
      return Emit(inv, response, [&] { PrintTenantList(inv.out, response); });
    };
  }
  {
    struct Args {
      std::string name;
      QuotaArgs quotas;
    };
    auto a = std::make_shared<Args>();
    CLI::App* c = AddCommand(tenant, "update-quotas",
                             "change quotas; the ones not given keep their current value");
    AddArgument(c, "NAME", &a->name, "tenant name");
    AddQuotaOptions(c, &a->quotas);
    c->callback([c] {
      if (!AnyGiven(*c, kQuotaOptions)) {
        throw CLI::ValidationError(
            "give at least one of --max-param-bytes, --max-keys, --max-workers");
      }
    });
    (*handlers)[c] = [a](const Invocation& inv) {
      admin::UpdateQuotasRequest request;
      request.set_name(a->name);
      *request.mutable_quotas() = ToQuotas(inv.command, a->quotas);
      auto stub = admin::TenantService::NewStub(inv.connection.channel());
      grpc::ClientContext context;
      inv.connection.Prepare(&context);
      admin::Tenant response;
      if (Status s = Check(stub->UpdateQuotas(&context, request, &response), inv.connection);
          !s.ok()) {
        return s;
      }
      return Emit(inv, response, [&] {
        inv.out << "updated the quotas of tenant '" << response.name() << "'\n";
        PrintTenant(inv.out, response);
      });
    };
  }
  {
    auto name = std::make_shared<std::string>();
    CLI::App* c = AddCommand(tenant, "delete", "delete a tenant and all its keys");
    AddArgument(c, "NAME", name.get(), "tenant name");
    (*handlers)[c] = [name](const Invocation& inv) {
      admin::DeleteTenantRequest request;
      request.set_name(*name);
      auto stub = admin::TenantService::NewStub(inv.connection.channel());
      grpc::ClientContext context;
      inv.connection.Prepare(&context);
      admin::DeleteTenantResponse response;
      if (Status s = Check(stub->DeleteTenant(&context, request, &response), inv.connection);
          !s.ok()) {
        return s;
      }
      return Emit(inv, response, [&] { inv.out << "deleted tenant '" << request.name() << "'\n"; });
    };
  }
}

// ---- Key commands --------------------------------------------------------

struct KeyRef {
  std::string tenant, name;
};

void AddKeyRef(CLI::App* command, KeyRef* key) {
  AddArgument(command, "TENANT", &key->tenant, "tenant name");
  AddArgument(command, "NAME", &key->name, "key name");
}

Result<admin::Key> GetKey(const Invocation& inv, const KeyRef& key, admin::KeyService::Stub* stub) {
  admin::GetKeyRequest request;
  request.set_tenant(key.tenant);
  request.set_name(key.name);
  grpc::ClientContext context;
  inv.connection.Prepare(&context);
  admin::Key response;
  if (Status s = Check(stub->GetKey(&context, request, &response), inv.connection); !s.ok()) {
    return s;
  }
  return response;
}

// --compression none|fp16|bf16|topk:R (fp16/bf16 are the wire dtype).
Status SetCompression(const std::string& text, bool dtype_given, admin::CreateKeyRequest* r) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgument("--compression: '" + text + "' " + why +
                           " (none, fp16, bf16 or topk:R with 0 < R <= 1)");
  };
  if (text == "none") return Status::Ok();
  if (text == "fp16" || text == "bf16") {
    const admin::DType d = text == "fp16" ? admin::FP16 : admin::BF16;
    if (dtype_given && r->dtype() != d) return bad("contradicts --dtype");
    r->set_dtype(d);
    return Status::Ok();
  }
  if (text.rfind("topk:", 0) != 0) return bad("is not a compression");
  const std::string num = text.substr(5);
  size_t used = 0;
  double ratio = 0;
  try {
    ratio = std::stod(num, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (num.empty() || used != num.size() || !(ratio > 0 && ratio <= 1)) {
    return bad("needs a ratio R in (0, 1]");
  }
  r->set_topk_ratio(static_cast<float>(ratio));
  return Status::Ok();
}

void AddKeyCommands(CLI::App* key, std::map<const CLI::App*, Handler>* handlers) {
  {
    struct Args {
      KeyRef key;
      uint64_t elements = 0, rows = 0, seed = 0;
      uint32_t dim = 0;
      double init_scale = 0;
      std::string dtype, init, compression;
      OptimizerArgs optimizer;
    };
    auto a = std::make_shared<Args>();
    CLI::App* c = AddCommand(
        key, "create", "create a key of N elements, or a row-sparse table of R rows x D",
        "--dtype is the wire type. --init zeros makes the key ready at once; --init client\n"
        "waits for rank 0 to send the initial values. Without optimizer options the key\n"
        "uses the tenant's default optimizer. --rows R --dim D make a row-sparse table\n"
        "(an embedding table: workers push and pull rows by id); its --init is zeros or\n"
        "random (uniform in [-S, S) with --init-scale S, seeded by --seed).");
    AddKeyRef(c, &a->key);
    CLI::Option* elements = c->add_option("--elements", a->elements, "number of elements")
                                ->type_name("N")
                                ->check(U64Validator());
    CLI::Option* rows = c->add_option("--rows", a->rows, "table: number of rows")
                            ->type_name("R")
                            ->check(U64Validator());
    CLI::Option* dim = c->add_option("--dim", a->dim, "table: elements per row")
                           ->type_name("D")
                           ->check(CLI::Range(1u, 65536u));
    c->add_option("--init-scale", a->init_scale, "table, --init random: values in [-S, S)")
        ->type_name("S")
        ->check(CLI::PositiveNumber);
    c->add_option("--seed", a->seed, "table, --init random: seed (default 0)")
        ->type_name("N")
        ->check(U64Validator());
    rows->needs(dim);
    dim->needs(rows);
    elements->excludes(rows);
    c->add_option("--dtype", a->dtype, "wire type (default fp32)")
        ->type_name("fp32|fp16|bf16")
        ->check(OneOfValidator(Names(kDTypes)));
    c->add_option("--compression", a->compression,
                  "pushes: none (default), fp16/bf16 (the wire type), topk:R (the R largest "
                  "share of each chunk's gradient, 0 < R <= 1; docs/compression.md)")
        ->type_name("none|fp16|bf16|topk:R");
    c->add_option("--init", a->init, "initial values (default zeros)")
        ->type_name("zeros|client|random")
        ->check(OneOfValidator(Names(kInitModes)));
    AddOptimizerOptions(c, &a->optimizer, /*create=*/true);
    (*handlers)[c] = [a](const Invocation& inv) {
      // (Not a CLI11 callback: AddOptimizerOptions owns this command's.)
      if (!AnyGiven(inv.command, {"--elements", "--rows"})) {
        return InvalidArgument(
            "key create: give --elements N (a dense key) or --rows R --dim D (a row-sparse "
            "table)");
      }
      admin::CreateKeyRequest request;
      request.set_tenant(a->key.tenant);
      request.set_name(a->key.name);
      request.set_elements(a->elements);
      request.set_rows(a->rows);
      request.set_dim(a->dim);
      request.set_init_scale(static_cast<float>(a->init_scale));
      request.set_init_seed(a->seed);
      if (Given(inv.command, "--dtype")) request.set_dtype(*Choice(a->dtype, kDTypes));
      if (Given(inv.command, "--compression")) {
        if (Status s = SetCompression(a->compression, Given(inv.command, "--dtype"), &request);
            !s.ok()) {
          return s;
        }
      }
      if (Given(inv.command, "--init")) request.set_init(*Choice(a->init, kInitModes));
      if (AnyGiven(inv.command, kOptimizerOptions)) {
        *request.mutable_optimizer() = ApplyOptimizerOptions(inv.command, a->optimizer, {});
      }
      auto stub = admin::KeyService::NewStub(inv.connection.channel());
      grpc::ClientContext context;
      inv.connection.Prepare(&context);
      admin::Key response;
      if (Status s = Check(stub->CreateKey(&context, request, &response), inv.connection); !s.ok()) {
        return s;
      }
      return Emit(inv, response, [&] {
        inv.out << "created key '" << response.name() << "' in tenant '" << response.tenant()
                << "'\n";
        PrintKey(inv.out, response, /*chunks=*/true);
      });
    };
  }
  {
    auto k = std::make_shared<KeyRef>();
    CLI::App* c = AddCommand(
        key, "get", "show a key and its chunk layout (chunk, lane, first element, elements)");
    AddKeyRef(c, k.get());
    (*handlers)[c] = [k](const Invocation& inv) {
      auto stub = admin::KeyService::NewStub(inv.connection.channel());
      const Result<admin::Key> response = GetKey(inv, *k, stub.get());
      if (!response.ok()) return response.status();
      return Emit(inv, *response, [&] { PrintKey(inv.out, *response, /*chunks=*/true); });
    };
  }
  {
    auto tenant = std::make_shared<std::string>();
    CLI::App* c = AddCommand(key, "list", "list the keys of a tenant");
    AddArgument(c, "TENANT", tenant.get(), "tenant name");
    (*handlers)[c] = [tenant](const Invocation& inv) {
      admin::ListKeysRequest request;
      request.set_tenant(*tenant);
      auto stub = admin::KeyService::NewStub(inv.connection.channel());
      grpc::ClientContext context;
      inv.connection.Prepare(&context);
      admin::ListKeysResponse response;
      if (Status s = Check(stub->ListKeys(&context, request, &response), inv.connection); !s.ok()) {
        return s;
      }
      return Emit(inv, response, [&] { PrintKeyList(inv.out, request.tenant(), response); });
    };
  }
  {
    auto k = std::make_shared<KeyRef>();
    CLI::App* c = AddCommand(key, "delete", "delete a key");
    AddKeyRef(c, k.get());
    (*handlers)[c] = [k](const Invocation& inv) {
      admin::DeleteKeyRequest request;
      request.set_tenant(k->tenant);
      request.set_name(k->name);
      auto stub = admin::KeyService::NewStub(inv.connection.channel());
      grpc::ClientContext context;
      inv.connection.Prepare(&context);
      admin::DeleteKeyResponse response;
      if (Status s = Check(stub->DeleteKey(&context, request, &response), inv.connection); !s.ok()) {
        return s;
      }
      return Emit(inv, response, [&] {
        inv.out << "deleted key '" << request.name() << "' from tenant '" << request.tenant()
                << "'\n";
      });
    };
  }
  {
    struct Args {
      KeyRef key;
      OptimizerArgs optimizer;
    };
    auto a = std::make_shared<Args>();
    CLI::App* c = AddCommand(
        key, "set-optimizer", "change a key's optimizer hyperparameters",
        "Options not given keep their current values; the optimizer type cannot change.");
    AddKeyRef(c, &a->key);
    AddOptimizerOptions(c, &a->optimizer, /*create=*/false);
    c->callback([c] {
      if (!AnyGiven(*c, kOptimizerOptions)) {
        throw CLI::ValidationError("give at least one optimizer option (e.g. --lr X)");
      }
    });
    // Options not given keep the key's current values: the current optimizer
    // is read first and the given options are laid over it. When --optimizer
    // names another type nothing is carried over (the daemon decides whether
    // the change is allowed).
    (*handlers)[c] = [a](const Invocation& inv) {
      const admin::Optimizer given = ApplyOptimizerOptions(inv.command, a->optimizer, {});
      auto stub = admin::KeyService::NewStub(inv.connection.channel());
      const Result<admin::Key> current = GetKey(inv, a->key, stub.get());
      if (!current.ok()) return current.status();
      admin::Optimizer base = current->optimizer();
      if (Given(inv.command, "--optimizer") && given.type() != base.type()) {
        base = admin::Optimizer();
      }
      admin::SetOptimizerRequest request;
      request.set_tenant(a->key.tenant);
      request.set_name(a->key.name);
      *request.mutable_optimizer() = ApplyOptimizerOptions(inv.command, a->optimizer, base);
      grpc::ClientContext context;
      inv.connection.Prepare(&context);
      admin::Key response;
      if (Status s = Check(stub->SetOptimizer(&context, request, &response), inv.connection);
          !s.ok()) {
        return s;
      }
      return Emit(inv, response, [&] {
        inv.out << "updated the optimizer of key '" << response.name() << "' in tenant '"
                << response.tenant() << "'\n";
        PrintKey(inv.out, response, /*chunks=*/false);
      });
    };
  }
}

// ---- Stats ---------------------------------------------------------------

void AddStatsCommand(CLI::App* app, std::map<const CLI::App*, Handler>* handlers) {
  auto tenant = std::make_shared<std::string>();
  CLI::App* c = AddCommand(app, "stats", "daemon counters and per-tenant counters");
  c->add_option("TENANT", *tenant, "only this tenant (default: all)")->type_name("");
  (*handlers)[c] = [tenant](const Invocation& inv) {
    admin::GetStatsRequest request;
    if (Given(inv.command, "TENANT")) request.set_tenant(*tenant);
    auto stub = admin::StatsService::NewStub(inv.connection.channel());
    grpc::ClientContext context;
    inv.connection.Prepare(&context);
    admin::GetStatsResponse response;
    if (Status s = Check(stub->GetStats(&context, request, &response), inv.connection); !s.ok()) {
      return s;
    }
    return Emit(inv, response, [&] { PrintStats(inv.out, response); });
  };
}

// The named subcommands of `app`.
std::vector<const CLI::App*> Children(const CLI::App& app) {
  std::vector<const CLI::App*> out;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (!sub->get_name().empty()) out.push_back(sub);
  }
  return out;
}

std::string ChildNames(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : Children(app)) names.push_back(sub->get_name());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Whether some command of the tree under `app` has an option `name`.
bool KnownOption(const CLI::App& app, const std::string& name) {
  if (app.get_option_no_throw(name) != nullptr) return true;
  for (const CLI::App* sub : Children(app)) {
    if (KnownOption(*sub, name)) return true;
  }
  return false;
}

}  // namespace

Commands::Commands() : app_(kDescription, "rackhubctl") {
  // Inherited by every subcommand created below: options of the commands
  // above (the global ones) are accepted anywhere; leftovers are collected
  // (not thrown) so CheckComplete can name them; one subcommand per level.
  app_.fallthrough();
  app_.allow_extras();
  app_.require_subcommand(0, 1);
  app_.get_formatter()->column_width(34);

  // Global options: read from the CommandLine by ReadConnectionOptions.
  app_.add_option("--admin", "admin API address (default 127.0.0.1:7701; IPv6 as [ADDR]:PORT)")
      ->type_name("HOST:PORT")
      ->check(EndpointValidator());
  app_.add_option("--token-file",
                  "file holding the admin token (surrounding whitespace is trimmed);\n"
                  "sent as `authorization: Bearer <token>`")
      ->type_name("FILE");
  app_.add_option("--tls-ca", "use TLS, trusting this CA certificate (PEM)")->type_name("FILE");
  CLI::Option* tls_cert =
      app_.add_option("--tls-cert", "client certificate (PEM) for TLS")->type_name("FILE");
  CLI::Option* tls_key =
      app_.add_option("--tls-key", "private key (PEM) of the client certificate")
          ->type_name("FILE");
  tls_cert->needs(tls_key);
  tls_key->needs(tls_cert);
  app_.add_option("--tls-server-name",
                  "name to check in the daemon's certificate instead of HOST (any --tls-*\n"
                  "option turns TLS on; without --tls-ca the system's trusted CAs are used)")
      ->type_name("NAME");
  static const std::string kJsonHelp =
      "machine-readable output: the response message as one JSON document on\n"
      "stdout (proto field names, all fields)";
  app_.add_flag("--json", kJsonHelp);
  app_.add_option("--timeout", "deadline of each call (default 10; decimals allowed)")
      ->type_name("SECONDS")
      ->check(SecondsValidator());

  AddTenantCommands(
      AddCommand(&app_, "tenant", "tenants: create, get, list, update-quotas, delete"),
      &handlers_);
  AddKeyCommands(AddCommand(&app_, "key", "keys: create, get, list, delete, set-optimizer"),
                 &handlers_);
  AddCheckpointCommands(
      AddCommand(&app_, "checkpoint", "checkpoints of a tenant: create, list, delete, restore"),
      &handlers_);
  AddStatsCommand(&app_, &handlers_);
  AddMonitorCommands(&app_, &handlers_);
  help_ = app_.add_subcommand("help", "show this help, or a command's (e.g. help key create)");
  help_->add_option("COMMAND", help_words_, "command words")->type_name("");
  // Last: a footer set earlier would be inherited by the commands.
  app_.footer(kFooter);
}

const CLI::App& Commands::Selected() const {
  const CLI::App* app = &app_;
  while (!app->get_subcommands().empty()) app = app->get_subcommands().front();
  return *app;
}

std::string Commands::SelectedName() const {
  std::string name;
  for (const CLI::App* app = &app_; !app->get_subcommands().empty();) {
    app = app->get_subcommands().front();
    name += (name.empty() ? "" : " ") + app->get_name();
  }
  return name;
}

bool Commands::HelpSelected() const { return &Selected() == help_; }

Status Commands::CheckComplete() const {
  const CLI::App& selected = Selected();
  const std::string name = SelectedName();
  const bool group = !Children(selected).empty();
  std::vector<std::string> extras = app_.remaining(/*recurse=*/true);
  // CLI11 keeps the "--" that ends the options among the leftovers.
  extras.erase(std::remove(extras.begin(), extras.end(), "--"), extras.end());
  if (!extras.empty()) {
    const std::string& first = extras.front();
    if (first.size() > 1 && first[0] == '-') {
      const std::string option = first.substr(0, first.find('='));
      if (!KnownOption(app_, option)) return InvalidArgument("unknown option " + option);
      if (name.empty()) {
        return InvalidArgument(fmt::format("option {} belongs after its command's words", option));
      }
      if (selected.get_option_no_throw(option) != nullptr) {
        return InvalidArgument(
            fmt::format("option {} belongs after the command words '{}'", option, name));
      }
      return InvalidArgument(fmt::format("option {} does not apply to '{}'", option, name));
    }
    if (name.empty()) {
      return InvalidArgument(
          fmt::format("unknown command '{}' (expected one of: {})", first, ChildNames(app_)));
    }
    if (group) {
      return InvalidArgument(fmt::format("unknown command '{} {}' (expected one of: {})", name,
                                         first, ChildNames(selected)));
    }
    return InvalidArgument(fmt::format("{}: unexpected argument '{}'", name, first));
  }
  if (name.empty()) {
    return InvalidArgument(fmt::format("no command given (expected one of: {})", ChildNames(app_)));
  }
  if (group) {
    return InvalidArgument(fmt::format("'{}' needs a subcommand: {}", name, ChildNames(selected)));
  }
  return Status::Ok();
}

std::string Commands::Describe(const CLI::ParseError& error) const {
  std::string message = error.what();
  std::replace(message.begin(), message.end(), '\n', ' ');
  if (error.get_name() == "ArgumentMismatch") {
    // CLI11 says "--x: At Most 1 required but received 2" or "--x: 1 required N missing".
    const std::string option = message.substr(0, message.find(": "));
    if (message.find("At Most 1 required") != std::string::npos) {
      message = option + ": given more than once";
    } else if (message.find(" missing") != std::string::npos) {
      message = option + ": needs a value";
    }
  }
  const std::string name = SelectedName();
  if (!name.empty() && (error.get_name() == "RequiredError" || message.rfind("--", 0) != 0)) {
    message = name + ": " + message;
  }
  return message;
}

Result<std::string> Commands::HelpText() const {
  if (!HelpSelected()) return app_.help();
  const CLI::App* app = &app_;
  std::string path = app_.get_name();
  for (const std::string& word : help_words_) {
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : Children(*app)) {
      if (sub->get_name() == word) next = sub;
    }
    if (next == nullptr) {
      return InvalidArgument(fmt::format("help: unknown command '{}'", word));
    }
    app = next;
    path += " " + word;
  }
  return app->get_formatter()->make_help(app, path, CLI::AppFormatMode::Normal);
}

Status Commands::Run(Connection& connection, const CommandLine& cl, std::ostream& out) const {
  const CLI::App& command = Selected();
  return handlers_.at(&command)(Invocation{command, cl, connection, out});
}

}  // namespace rackhub::cli
