// rackhubctl key create|get|list|delete|set-optimizer (the admin
// KeyService), registered by Commands (commands.cc).
#include <string>

#include "command_tree.h"
#include "format.h"
#include "rackhub/admin/v1/admin.grpc.pb.h"

namespace rackhub::cli {
namespace {

using KeyStub = admin::KeyService::Stub;

// TENANT NAME: the key a command is about.
struct KeyRef {
  std::string tenant, name;
};

// A request that names the key `key`.
template <typename Request>
Request ForKey(const KeyRef& key) {
  Request request;
  request.set_tenant(key.tenant);
  request.set_name(key.name);
  return request;
}

void AddKeyRef(CLI::App* command, KeyRef* key) {
  AddArgument(command, "TENANT", &key->tenant, "tenant name");
  AddArgument(command, "NAME", &key->name, "key name");
}

// Shows a Key the daemon returned: "<what> 'NAME' in tenant 'TENANT'", then
// the key.
auto ShowKey(const char* what, bool chunks = true) {
  return [what, chunks](std::ostream& out, const admin::Key& key) {
    out << what << " '" << key.name() << "' in tenant '" << key.tenant() << "'\n";
    PrintKey(out, key, chunks);
  };
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
  r->set_topk_ratio_exact(ratio);
  return Status::Ok();
}

}  // namespace

void AddKeyCommands(CLI::App* key, Handlers* handlers) {
  {
    struct Args {
      KeyRef key;
      uint64_t elements = 0, rows = 0, seed = 0;
      uint32_t dim = 0;
      double init_scale = 0;
      std::string dtype, init, compression;
      OptimizerArgs optimizer;
    };
    const auto c = DefineCommand<Args>(
        key, "create", "create a key of N elements, or a row-sparse table of R rows x D",
        "--dtype is the wire type. --init zeros makes the key ready at once; --init client\n"
        "waits for rank 0 to send the initial values. Without optimizer options the key\n"
        "uses the tenant's default optimizer. --rows R --dim D make a row-sparse table\n"
        "(an embedding table: workers push and pull rows by id); its --init is zeros or\n"
        "random (uniform in [-S, S) with --init-scale S, seeded by --seed).");
    Args& a = *c.args;
    AddKeyRef(c.app, &a.key);
    CLI::Option* elements = c.app->add_option("--elements", a.elements, "number of elements")
                                ->type_name("N")
                                ->check(U64Validator());
    CLI::Option* rows = c.app->add_option("--rows", a.rows, "table: number of rows")
                            ->type_name("R")
                            ->check(U64Validator());
    CLI::Option* dim = c.app->add_option("--dim", a.dim, "table: elements per row")
                           ->type_name("D")
                           ->check(CLI::Range(1u, 65536u));
    c.app->add_option("--init-scale", a.init_scale, "table, --init random: values in [-S, S)")
        ->type_name("S")
        ->check(CLI::PositiveNumber);
    c.app->add_option("--seed", a.seed, "table, --init random: seed (default 0)")
        ->type_name("N")
        ->check(U64Validator());
    rows->needs(dim);
    dim->needs(rows);
    elements->excludes(rows);
    AddChoiceOption(c.app, "--dtype", &a.dtype, "wire type (default fp32)", kDTypeNames);
    c.app
        ->add_option("--compression", a.compression,
                     "pushes: none (default), fp16/bf16 (the wire type), topk:R (the R largest "
                     "share of each chunk's gradient, 0 < R <= 1; docs/compression.md)")
        ->type_name("none|fp16|bf16|topk:R");
    AddChoiceOption(c.app, "--init", &a.init, "initial values (default zeros)", kInitModeNames);
    AddOptimizerOptions(c.app, &a.optimizer, /*create=*/true);
    Handle(handlers, c, [](const Invocation& inv, const Args& a) {
      // (Not a CLI11 callback: AddOptimizerOptions owns this command's.)
      if (!AnyGiven(inv.command, {"--elements", "--rows"})) {
        return InvalidArgument(
            "key create: give --elements N (a dense key) or --rows R --dim D (a row-sparse "
            "table)");
      }
      auto request = ForKey<admin::CreateKeyRequest>(a.key);
      request.set_elements(a.elements);
      request.set_rows(a.rows);
      request.set_dim(a.dim);
      request.set_init_scale(static_cast<float>(a.init_scale));
      request.set_init_seed(a.seed);
      if (Given(inv.command, "--dtype")) request.set_dtype(*Choice(a.dtype, kDTypeNames));
      if (Given(inv.command, "--compression")) {
        if (Status s = SetCompression(a.compression, Given(inv.command, "--dtype"), &request);
            !s.ok()) {
          return s;
        }
      }
      if (Given(inv.command, "--init")) request.set_init(*Choice(a.init, kInitModeNames));
      if (AnyGiven(inv.command, kOptimizerOptions)) {
        *request.mutable_optimizer() = ApplyOptimizerOptions(inv.command, a.optimizer, {});
      }
      return CallAndShow(inv, &KeyStub::CreateKey, request, ShowKey("created key"));
    });
  }
  {
    struct Args {
      KeyRef key;
      uint64_t chunk_offset = 0;
      uint32_t chunk_limit = 0;
    };
    const auto c = DefineCommand<Args>(
        key, "get",
        "show a key, its chunks per lane and a page of its chunk layout (chunk, lane, first\n"
        "element, elements)",
        "The chunk layout lists --chunk-limit chunks (default 1000, at most 10000) from the\n"
        "key's chunk --chunk-offset (default 0): a key of millions of chunks is read page by\n"
        "page.");
    AddKeyRef(c.app, &c.args->key);
    c.app->add_option("--chunk-offset", c.args->chunk_offset, "first chunk listed (of the key)")
        ->type_name("N")
        ->check(U64Validator());
    c.app->add_option("--chunk-limit", c.args->chunk_limit, "chunks listed (1..10000)")
        ->type_name("N")
        ->check(CLI::Range(1u, 10000u));
    Handle(handlers, c, [](const Invocation& inv, const Args& a) {
      auto request = ForKey<admin::GetKeyRequest>(a.key);
      request.set_chunk_offset(a.chunk_offset);
      request.set_chunk_limit(a.chunk_limit);
      return CallAndShow(inv, &KeyStub::GetKey, request,
                         [](std::ostream& out, const admin::Key& response) {
                           PrintKey(out, response, /*chunks=*/true);
                         });
    });
  }
  {
    const auto c = DefineCommand<std::string>(key, "list", "list the keys of a tenant");
    AddArgument(c.app, "TENANT", c.args.get(), "tenant name");
    Handle(handlers, c, [](const Invocation& inv, const std::string& tenant) {
      admin::ListKeysRequest request;
      request.set_tenant(tenant);
      return CallAndShow(inv, &KeyStub::ListKeys, request,
                         [&tenant](std::ostream& out, const admin::ListKeysResponse& response) {
                           PrintKeyList(out, tenant, response);
                         });
    });
  }
  {
    const auto c = DefineCommand<KeyRef>(key, "delete", "delete a key");
    AddKeyRef(c.app, c.args.get());
    Handle(handlers, c, [](const Invocation& inv, const KeyRef& k) {
      return CallAndShow(inv, &KeyStub::DeleteKey, ForKey<admin::DeleteKeyRequest>(k),
                         [&k](std::ostream& out, const admin::DeleteKeyResponse&) {
                           out << "deleted key '" << k.name << "' from tenant '" << k.tenant
                               << "'\n";
                         });
    });
  }
  {
    struct Args {
      KeyRef key;
      OptimizerArgs optimizer;
    };
    const auto c = DefineCommand<Args>(
        key, "set-optimizer", "change a key's optimizer hyperparameters",
        "Options not given keep their current values; the optimizer type cannot change.");
    AddKeyRef(c.app, &c.args->key);
    AddOptimizerOptions(c.app, &c.args->optimizer, /*create=*/false);
    c.app->callback([app = c.app] {
      if (!AnyGiven(*app, kOptimizerOptions)) {
        throw CLI::ValidationError("give at least one optimizer option (e.g. --lr X)");
      }
    });
    // Options not given keep the key's current values: the current optimizer
    // is read first and the given options are laid over it. When --optimizer
    // names another type nothing is carried over (the daemon decides whether
    // the change is allowed).
    Handle(handlers, c, [](const Invocation& inv, const Args& a) {
      const admin::Optimizer given = ApplyOptimizerOptions(inv.command, a.optimizer, {});
      const Result<admin::Key> current =
          Call(inv, &KeyStub::GetKey, ForKey<admin::GetKeyRequest>(a.key));
      if (!current.ok()) return current.status();
      admin::Optimizer base = current->optimizer();
      if (Given(inv.command, "--optimizer") && given.type() != base.type()) {
        base = admin::Optimizer();
      }
      auto request = ForKey<admin::SetOptimizerRequest>(a.key);
      *request.mutable_optimizer() = ApplyOptimizerOptions(inv.command, a.optimizer, base);
      return CallAndShow(inv, &KeyStub::SetOptimizer, request,
                         ShowKey("updated the optimizer of key", /*chunks=*/false));
    });
  }
}

}  // namespace rackhub::cli
