// rackhubctl key create|get|list|delete|set-optimizer (the admin
// KeyService), registered by Commands (commands.cc).
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "command_tree.h"
#include "format.h"
#include "help.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"

namespace rackhub::cli {
namespace {

const std::vector<std::pair<std::string, admin::DType>> kDTypes = {
    {"fp32", admin::FP32}, {"fp16", admin::FP16}, {"bf16", admin::BF16}};
const std::vector<std::pair<std::string, admin::InitMode>> kInitModes = {
    {"zeros", admin::ZEROS}, {"client", admin::FROM_CLIENT}, {"random", admin::RANDOM}};

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

}  // namespace

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

}  // namespace rackhub::cli
